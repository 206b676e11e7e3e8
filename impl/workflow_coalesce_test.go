package impl_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/store"
	"github.com/stinthq/stint/store/postgres"
)

// gatedWorkflows records the workflow submit statements sent through a
// store (the workflows of each) and holds the first until released.
type gatedWorkflows struct {
	*postgres.Store
	mu    sync.Mutex
	calls []int
	hold  chan struct{} // the first call waits until it is closed
	held  chan struct{} // closed once the first call waits
}

func (g *gatedWorkflows) SubmitWorkflows(ctx context.Context, tx pgx.Tx, wfs []store.NewWorkflow) ([]store.WorkflowOutcome, error) {
	g.mu.Lock()
	first := len(g.calls) == 0
	g.calls = append(g.calls, len(wfs))
	g.mu.Unlock()
	if first {
		close(g.held)
		<-g.hold
	}
	return g.Store.SubmitWorkflows(ctx, tx, wfs)
}

// record returns the workflows of each call so far.
func (g *gatedWorkflows) record() []int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]int(nil), g.calls...)
}

// wfOutcome is what one SubmitWorkflow returned.
type wfOutcome struct {
	sub api.WorkflowSubmission
	err error
}

// submitWorkflowAsync submits req through c in a goroutine and returns
// where its outcome arrives.
func submitWorkflowAsync(ctx context.Context, c api.Workflows, req api.WorkflowRequest) <-chan wfOutcome {
	ch := make(chan wfOutcome, 1)
	go func() {
		sub, err := c.SubmitWorkflow(ctx, req)
		ch <- wfOutcome{sub, err}
	}()
	return ch
}

// diamond is a workflow of id: a -> b, a -> c, {b, c} -> d, each node
// recording its run in test_span.
func diamond(id string) api.WorkflowRequest {
	return api.WorkflowRequest{ID: api.TaskID(id), Nodes: []api.WorkflowNode{
		spanNode("a", 0), spanNode("b", 0, "a"), spanNode("c", 0, "a"), spanNode("d", 0, "b", "c"),
	}}
}

// holdFirstWorkflow gives the test a database and a client on a gated
// store of it, whose first workflow submit, of "wf-first", is held in the
// store: the submits that follow wait in batches until the test closes
// g.hold.
func holdFirstWorkflow(t *testing.T) (e *env, c *impl.Client, g *gatedWorkflows, first <-chan wfOutcome) {
	t.Helper()
	e = setup(t)
	g = &gatedWorkflows{Store: e.st, hold: make(chan struct{}), held: make(chan struct{})}
	c, err := impl.NewClient(g, impl.ClientConfig{Registry: testRegistry(e.pool, "client", time.Second), PollInterval: 100 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	first = submitWorkflowAsync(e.ctx, c, diamond("wf-first"))
	select {
	case <-g.held:
	case <-time.After(20 * time.Second):
		t.Fatal("the first workflow submit never reached the store")
	}
	return e, c, g, first
}

// TestConcurrentWorkflowSubmitsShareOneStatement: the workflow submits
// that arrive while one is in the database go out together, in one
// statement, once it returns; each caller gets its own workflow, stored
// whole.
func TestConcurrentWorkflowSubmitsShareOneStatement(t *testing.T) {
	t.Parallel()
	e, c, g, first := holdFirstWorkflow(t)
	const n = 30
	outs := make([]<-chan wfOutcome, n)
	for i := range outs {
		outs[i] = submitWorkflowAsync(e.ctx, c, diamond(fmt.Sprintf("wf-%02d", i)))
	}
	waitFor(t, 20*time.Second, "the workflows to wait in a batch", func() bool { return impl.WorkflowsWaiting(c) == n })
	close(g.hold)
	require.NoError(t, (<-first).err)
	for i, ch := range outs {
		o := <-ch
		require.NoError(t, o.err, i)
		require.True(t, o.sub.Created, i)
		id := api.TaskID(fmt.Sprintf("wf-%02d", i))
		require.Equal(t, id, o.sub.ID)
		require.Equal(t, id+"/d", o.sub.Nodes["d"])
	}
	require.Equal(t, []int{1, n}, g.record(), "one statement for the first, one for the rest")
	require.Equal(t, (n+1)*4, e.count(`SELECT count(*) FROM stint_task WHERE workflow_node IS NOT NULL`))
	require.Equal(t, (n+1)*4, e.count(`SELECT count(*) FROM `+allEdges+` e`))
	require.Equal(t, n+1, e.count(`SELECT count(*) FROM stint_task WHERE behavior = 'stint.workflow' AND children_pending = 4`))
	require.Equal(t, n+1, e.count(`SELECT count(*) FROM stint_task WHERE workflow_node = 'a' AND status = 'scheduled'`),
		"the nodes without dependencies are due")
	w, err := c.GetWorkflow(e.ctx, "wf-07")
	require.NoError(t, err)
	d, ok := w.Node("d")
	require.True(t, ok)
	require.Equal(t, []string{"b", "c"}, d.DependsOn)
}

// TestManyCallersSubmitSmallWorkflowsAtOnce: 20 goroutines submit 200
// diamonds at once through one client while a server works them; every
// workflow succeeds, each of its nodes ran exactly once, and none
// started before its dependencies ended.
func TestManyCallersSubmitSmallWorkflowsAtOnce(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.server("n1", 5*time.Second)
	c := e.client()
	const callers, each = 20, 10
	var wg sync.WaitGroup
	errs := make(chan error, callers*each)
	for k := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				sub, err := c.SubmitWorkflow(e.ctx, diamond(fmt.Sprintf("wf-%02d-%02d", k, i)))
				if err == nil && !sub.Created {
					err = fmt.Errorf("workflow %s not created", sub.ID)
				}
				if err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	for k := range callers {
		for i := range each {
			w, err := c.AwaitWorkflow(e.ctx, api.TaskID(fmt.Sprintf("wf-%02d-%02d", k, i)))
			require.NoError(t, err)
			require.Equal(t, api.WorkflowSucceeded, w.State, w.ID)
		}
	}
	require.Equal(t, callers*each*4, e.count(`SELECT count(*) FROM test_span`))
	require.Equal(t, callers*each*4, e.count(`SELECT count(DISTINCT task_id) FROM test_span`), "each node ran once")
	require.Zero(t, e.count(`SELECT count(*) FROM `+allEdges+` x, test_span n, test_span d
		WHERE n.task_id = x.task_id AND d.task_id = x.depends_on AND n.started < d.ended`),
		"a node started before a dependency ended")
}

// TestABatchOfWorkflowsRefusesOnlyItsBadOnes: in one batch, a workflow
// whose node's id is taken by a plain task and one whose id is a plain
// task's are refused, each with its own error and nothing of it stored,
// while the others of the batch are stored.
func TestABatchOfWorkflowsRefusesOnlyItsBadOnes(t *testing.T) {
	t.Parallel()
	e, c, g, first := holdFirstWorkflow(t)
	for id, key := range map[api.TaskID]string{"wf-node-taken/b": "x", "wf-plain": "y"} {
		req := workReq(workKind, WorkParams{Key: key})
		req.ID = id
		_, err := c.Submit(e.ctx, req)
		require.NoError(t, err)
	}
	good := make([]<-chan wfOutcome, 6)
	for i := range good {
		good[i] = submitWorkflowAsync(e.ctx, c, diamond(fmt.Sprintf("wf-good-%d", i)))
	}
	nodeTaken := submitWorkflowAsync(e.ctx, c, diamond("wf-node-taken"))
	plain := submitWorkflowAsync(e.ctx, c, diamond("wf-plain"))
	waitFor(t, 20*time.Second, "the workflows to wait in a batch", func() bool { return impl.WorkflowsWaiting(c) == len(good)+2 })
	close(g.hold)
	require.NoError(t, (<-first).err)
	o := <-nodeTaken
	require.ErrorIs(t, o.err, api.ErrInvalid)
	require.Contains(t, o.err.Error(), "taken by another task")
	o = <-plain
	require.ErrorIs(t, o.err, api.ErrConflict)
	require.Contains(t, o.err.Error(), "not a workflow")
	for i, ch := range good {
		o := <-ch
		require.NoError(t, o.err, i)
		require.True(t, o.sub.Created, i)
	}
	require.Equal(t, []int{1, len(good) + 2}, g.record()[:2], "the bad ones shared the others' batch")
	require.Zero(t, e.count(`SELECT count(*) FROM stint_task WHERE id = 'wf-node-taken' OR parent_id IN ('wf-node-taken', 'wf-plain')`),
		"nothing of a refused workflow is stored")
	require.Equal(t, (len(good)+1)*4, e.count(`SELECT count(*) FROM stint_task WHERE workflow_node IS NOT NULL`))
	require.Equal(t, (len(good)+1)*4, e.count(`SELECT count(*) FROM `+allEdges+` e`))
	task, err := c.Get(e.ctx, "wf-plain")
	require.NoError(t, err)
	require.Equal(t, workKind.ID, task.Behavior, "the plain task is left as it was")
}

// TestTheSameWorkflowSubmittedConcurrentlyIsCreatedOnce: submits of one
// id at once, through one client (which never puts an id twice in a
// batch) and through two, create the workflow once; every other caller
// gets Created false.
func TestTheSameWorkflowSubmittedConcurrentlyIsCreatedOnce(t *testing.T) {
	t.Parallel()
	e, c, g, first := holdFirstWorkflow(t)
	other := e.client()
	const n = 8
	var outs []<-chan wfOutcome
	for range n {
		outs = append(outs, submitWorkflowAsync(e.ctx, c, diamond("wf-same")), submitWorkflowAsync(e.ctx, other, diamond("wf-same")))
	}
	waitFor(t, 20*time.Second, "the submits of one client to wait", func() bool { return impl.WorkflowsWaiting(c) == n })
	close(g.hold)
	require.NoError(t, (<-first).err)
	created := 0
	for _, ch := range outs {
		o := <-ch
		require.NoError(t, o.err)
		require.Equal(t, api.TaskID("wf-same"), o.sub.ID)
		if o.sub.Created {
			created++
		}
	}
	require.Equal(t, 1, created)
	require.Equal(t, 4, e.count(`SELECT count(*) FROM stint_task WHERE parent_id = 'wf-same'`))
	require.Equal(t, 4, e.count(`SELECT count(*) FROM `+allEdges+` e WHERE task_id LIKE 'wf-same/%'`))
	for _, n := range g.record()[1:] {
		require.Equal(t, 1, n, "a batch holds an id once")
	}
}

// TestAWorkflowSubmitGivenUpBeforeItsBatchWentOutStoresNothing: a caller
// whose context ends while its workflow waits in a batch gets the
// context's error, and its workflow is not stored.
func TestAWorkflowSubmitGivenUpBeforeItsBatchWentOutStoresNothing(t *testing.T) {
	t.Parallel()
	e, c, g, first := holdFirstWorkflow(t)
	ctx, cancel := context.WithCancel(e.ctx)
	gone := submitWorkflowAsync(ctx, c, diamond("wf-gone"))
	kept := submitWorkflowAsync(e.ctx, c, diamond("wf-kept"))
	waitFor(t, 20*time.Second, "the workflows to wait in a batch", func() bool { return impl.WorkflowsWaiting(c) == 2 })
	cancel()
	o := <-gone
	require.True(t, errors.Is(o.err, context.Canceled), "%v", o.err)
	close(g.hold)
	require.NoError(t, (<-first).err)
	o = <-kept
	require.NoError(t, o.err)
	require.True(t, o.sub.Created)
	require.Zero(t, e.count(`SELECT count(*) FROM stint_task WHERE id = 'wf-gone' OR parent_id = 'wf-gone'`))
}
