package impl

// Workflows: graphs of tasks submitted at once. A workflow is a task of
// api.WorkflowBehavior, the parent of its nodes; the store wakes or skips
// a node's dependents in the transaction that records its end, and the
// workflow's task runs once its last node ended, to record the outcome.

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/internal/sqltx"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/store"
)

var _ api.Workflows = (*Client)(nil)

// maxWorkflowIDLen bounds a workflow's id so that its nodes' ids (the id,
// a slash and a name of up to 64 characters) are valid task ids.
const maxWorkflowIDLen = 63

// SubmitWorkflow stores a workflow; see api.Workflows.
//
// Concurrent SubmitWorkflows of one Client share a statement and a commit
// (see workflowBatches), each caller getting its own submission or error
// once its workflow is committed. If ctx ends before the batch goes out,
// the workflow is not stored and SubmitWorkflow returns ctx's error; once
// the batch is in the database, SubmitWorkflow waits for its outcome.
func (c *Client) SubmitWorkflow(ctx context.Context, req api.WorkflowRequest) (api.WorkflowSubmission, error) {
	return c.submitWorkflow(ctx, nil, req, "")
}

// SubmitWorkflowTx stores a workflow in the caller's transaction tx: it
// exists, and its first nodes are claimed, only once tx commits.
func (c *Client) SubmitWorkflowTx(ctx context.Context, tx pgx.Tx, req api.WorkflowRequest) (api.WorkflowSubmission, error) {
	if tx == nil {
		return api.WorkflowSubmission{}, fmt.Errorf("submit workflow: %w", api.Invalid("tx", "is nil"))
	}
	return c.submitWorkflow(ctx, tx, req, "")
}

// SubmitWorkflowSQLTx is SubmitWorkflowTx in a database/sql transaction of
// pgx's stdlib driver; see SubmitSQLTx.
func (c *Client) SubmitWorkflowSQLTx(ctx context.Context, tx *sql.Tx, req api.WorkflowRequest) (sub api.WorkflowSubmission, err error) {
	if tx == nil {
		return sub, fmt.Errorf("submit workflow: %w", api.Invalid("tx", "is nil"))
	}
	ran := false
	err = sqltx.Run(ctx, tx, func(tx pgx.Tx) error {
		ran = true
		sub, err = c.submitWorkflow(ctx, tx, req, "")
		return err
	})
	if err != nil {
		return api.WorkflowSubmission{}, sqlTxError("submit workflow", ran, err)
	}
	return sub, nil
}

// submitWorkflow stores the workflow req in tx (none when nil); parent,
// when set, is the node that runs it as its sub-workflow.
func (c *Client) submitWorkflow(ctx context.Context, tx pgx.Tx, req api.WorkflowRequest, parent api.TaskID) (_ api.WorkflowSubmission, err error) {
	ctx, span := c.tel.startSubmit(ctx, api.WorkflowBehavior, len(req.Nodes))
	defer func() { endSpan(span, err) }()
	if req.Trace == "" {
		// Every node's run links to the workflow's submit: one trace.
		req.Trace = c.tel.traceparent(ctx)
	}
	wf, regs, err := c.prepareWorkflow(req)
	if err != nil {
		return api.WorkflowSubmission{}, fmt.Errorf("submit workflow: %w", err)
	}
	if err := c.checkRateUses(ctx, wf.Nodes, regs); err != nil {
		return api.WorkflowSubmission{}, fmt.Errorf("submit workflow: %w", err)
	}
	if parent != "" {
		if wf.Task.Params, err = withParent(wf.Task.Params, parent); err != nil {
			return api.WorkflowSubmission{}, fmt.Errorf("submit workflow: %w", err)
		}
	}
	var created bool
	if tx == nil {
		created, err = c.submitWorkflowCoalesced(ctx, wf)
	} else if created, err = c.st.SubmitWorkflow(ctx, tx, wf); err != nil {
		err = unavailable(err)
	}
	if err != nil {
		return api.WorkflowSubmission{}, err
	}
	sub := api.WorkflowSubmission{ID: wf.Task.ID, Created: created}
	if created {
		sub.Nodes = make(map[string]api.TaskID, len(wf.Nodes))
		for i, n := range wf.Nodes {
			sub.Nodes[wf.Names[i]] = n.ID
		}
	}
	return sub, nil
}

// prepareWorkflow validates a workflow request whole and turns it into
// what the store keeps. Every error wraps api.ErrInvalid and names the
// node or the field at fault.
func (c *Client) prepareWorkflow(req api.WorkflowRequest) (store.NewWorkflow, []*spi.Registration, error) {
	switch {
	case len(req.Nodes) == 0:
		return store.NewWorkflow{}, nil, api.Invalid("nodes", "a workflow needs at least one node")
	case len(req.Nodes) > api.MaxWorkflowNodes:
		return store.NewWorkflow{}, nil, api.Invalid("nodes", "%d nodes is over the limit of %d", len(req.Nodes), api.MaxWorkflowNodes)
	}
	id := req.ID
	if id == "" {
		id = spi.NewIDs(api.WorkflowBehavior).Unique()
	}
	if err := spi.CheckTaskID("id", id); err != nil {
		return store.NewWorkflow{}, nil, err
	}
	if len(id) > maxWorkflowIDLen || strings.Contains(string(id), "/") {
		return store.NewWorkflow{}, nil, api.Invalid("id", "%q must be at most %d characters, without a slash", id, maxWorkflowIDLen)
	}
	if err := spi.CheckTrace(req.Trace); err != nil {
		return store.NewWorkflow{}, nil, err
	}
	retention, err := checkRetention(req.Retention)
	if err != nil {
		return store.NewWorkflow{}, nil, err
	}
	index := make(map[string]int, len(req.Nodes))
	finally := -1
	for i, n := range req.Nodes {
		if err := checkNodeName(n.Name); err != nil {
			return store.NewWorkflow{}, nil, err
		}
		if _, dup := index[n.Name]; dup {
			return store.NewWorkflow{}, nil, api.Invalid("nodes", "node %q appears twice", n.Name)
		}
		index[n.Name] = i
		if n.Finally {
			if finally >= 0 {
				return store.NewWorkflow{}, nil, api.Invalid("nodes", "nodes %q and %q are both finally: a workflow has at most one", req.Nodes[finally].Name, n.Name)
			}
			if len(n.DependsOn) > 0 || n.Rule != "" {
				return store.NewWorkflow{}, nil, api.Invalid("nodes", "node %q is finally: it runs after every other node and takes no depends_on nor rule", n.Name)
			}
			finally = i
		}
	}
	wf := store.NewWorkflow{
		Task: store.NewTask{ID: id, Behavior: api.WorkflowBehavior, Params: json.RawMessage("{}"), Priority: spi.DefaultPriority,
			Trace: req.Trace, Retention: retention},
		Nodes:     make([]store.NewTask, len(req.Nodes)),
		Names:     make([]string, len(req.Nodes)),
		Rules:     make([]api.Rule, len(req.Nodes)),
		DependsOn: make([][]int, len(req.Nodes)),
	}
	regs := make([]*spi.Registration, len(req.Nodes))
	// namedBy[j] is 1 + the last node whose depends_on named node j: a
	// repeat is found in one step, however many dependencies a node has
	// (a join of a wide fan-out names tens of thousands).
	namedBy := make([]int, len(req.Nodes))
	for i, n := range req.Nodes {
		nt, reg, err := c.prepareNode(id, i, n, req.Trace)
		if err != nil {
			return store.NewWorkflow{}, nil, err
		}
		regs[i] = reg
		wf.Nodes[i], wf.Names[i], wf.Rules[i] = nt, n.Name, cmp.Or(n.Rule, api.RuleAllSucceeded)
		deps := make([]int, 0, len(n.DependsOn))
		for _, d := range n.DependsOn {
			j, ok := index[d]
			switch {
			case !ok:
				return store.NewWorkflow{}, nil, api.Invalid("nodes", "node %q depends on %q, which is not a node of the workflow", n.Name, d)
			case j == i:
				return store.NewWorkflow{}, nil, api.Invalid("nodes", "node %q depends on itself", n.Name)
			case j == finally:
				return store.NewWorkflow{}, nil, api.Invalid("nodes", "node %q depends on %q, the finally node, which runs last", n.Name, d)
			case namedBy[j] == i+1:
				return store.NewWorkflow{}, nil, api.Invalid("nodes", "node %q names %q twice in depends_on", n.Name, d)
			}
			namedBy[j] = i + 1
			deps = append(deps, j)
		}
		wf.DependsOn[i] = deps
	}
	if cycle := store.FindCycle(wf.DependsOn); cycle != nil {
		names := make([]string, len(cycle))
		for i, j := range cycle {
			names[i] = fmt.Sprintf("%q", wf.Names[j])
		}
		return store.NewWorkflow{}, nil, api.Invalid("nodes", "the dependencies form a cycle: %s", strings.Join(names, " -> "))
	}
	if finally >= 0 {
		all := make([]int, 0, len(req.Nodes)-1)
		for j := range req.Nodes {
			if j != finally {
				all = append(all, j)
			}
		}
		wf.DependsOn[finally], wf.Rules[finally] = all, store.RuleFinally
		wf.Task.Params, _ = json.Marshal(workflowParams{Finally: req.Nodes[finally].Name}) // a string: cannot fail
	}
	return wf, regs, nil
}

// prepareNode validates node i, n, of the workflow id and returns its
// task; trace is the workflow's traceparent, for a node without one.
func (c *Client) prepareNode(id api.TaskID, i int, n api.WorkflowNode, trace string) (store.NewTask, *spi.Registration, error) {
	if !n.Rule.Valid() {
		return store.NewTask{}, nil, api.Invalid("nodes", "node %q: rule %q is not one of all_succeeded, all_ended, any_succeeded, none_failed", n.Name, n.Rule)
	}
	if n.Task.ID != "" {
		return store.NewTask{}, nil, api.Invalid("nodes", "node %q: task.id must be empty: a node's id is its workflow's and its name", n.Name)
	}
	t := n.Task
	if n.Gate != nil && n.Workflow == nil {
		var err error
		if t, err = gateTask(n); err != nil {
			return store.NewTask{}, nil, err
		}
	}
	if n.Workflow != nil {
		var err error
		if t, err = c.subworkflowTask(id, i, n, trace); err != nil {
			return store.NewTask{}, nil, err
		}
	}
	t.ID = id + "/" + api.TaskID(n.Name)
	if t.Trace == "" {
		t.Trace = trace
	}
	nt, reg, err := c.prepare(t)
	if err != nil {
		return store.NewTask{}, nil, nodeError(i, n.Name, err)
	}
	nt.ParentID = id
	return nt, reg, nil
}

// nodeError names the node i, name, in err, an error of its task's
// validation: an *api.InvalidError's field becomes nodes[i].task.FIELD.
func nodeError(i int, name string, err error) error {
	var ie *api.InvalidError
	if !errors.As(err, &ie) {
		return fmt.Errorf("node %q: %w", name, err)
	}
	return &api.InvalidError{Field: fmt.Sprintf("nodes[%d].task.%s", i, ie.Field),
		Reason: fmt.Sprintf("%s (node %q)", ie.Reason, name), Err: ie.Unwrap()}
}

// checkNodeName returns an *api.InvalidError when name is not 1 to 64
// characters from A-Z a-z 0-9 . _ -.
func checkNodeName(name string) error {
	ok := len(name) >= 1 && len(name) <= 64
	for i := 0; ok && i < len(name); i++ {
		c := name[i]
		ok = 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-'
	}
	if !ok {
		return api.Invalid("nodes", "node name %q must be 1 to 64 characters from A-Z a-z 0-9 . _ -", name)
	}
	return nil
}

// prepareGrowth validates what the running node holder of workflow id adds
// to it, as prepareWorkflow validates a workflow; what only the stored
// graph can tell (names taken, dependencies on existing nodes, cycles
// through them) the store checks. trace is the node's traceparent.
func (c *Client) prepareGrowth(id, holder api.TaskID, g api.WorkflowGrowth, trace string) (store.NewNodes, []*spi.Registration, error) {
	switch {
	case len(g.Nodes) == 0:
		return store.NewNodes{}, nil, api.Invalid("nodes", "no nodes to add")
	case len(g.Nodes) > api.MaxWorkflowNodes:
		return store.NewNodes{}, nil, api.Invalid("nodes", "%d nodes is over the limit of %d", len(g.Nodes), api.MaxWorkflowNodes)
	}
	add := store.NewNodes{
		Nodes:           make([]store.NewTask, len(g.Nodes)),
		Names:           make([]string, len(g.Nodes)),
		Rules:           make([]api.Rule, len(g.Nodes)),
		DependsOn:       make([][]string, len(g.Nodes)),
		AddDependencies: g.AddDependencies,
	}
	isNew := make(map[string]bool, len(g.Nodes))
	for _, n := range g.Nodes {
		if err := checkNodeName(n.Name); err != nil {
			return store.NewNodes{}, nil, err
		}
		if isNew[n.Name] {
			return store.NewNodes{}, nil, api.Invalid("nodes", "node %q appears twice", n.Name)
		}
		isNew[n.Name] = true
	}
	regs := make([]*spi.Registration, len(g.Nodes))
	for i, n := range g.Nodes {
		if n.Finally {
			return store.NewNodes{}, nil, api.Invalid("nodes", "node %q: a node added at run time cannot be finally", n.Name)
		}
		nt, reg, err := c.prepareNode(id, i, n, trace)
		if err != nil {
			return store.NewNodes{}, nil, err
		}
		add.Nodes[i], add.Names[i], add.Rules[i], regs[i] = nt, n.Name, cmp.Or(n.Rule, api.RuleAllSucceeded), reg
		for _, d := range n.DependsOn {
			switch {
			case d == n.Name:
				return store.NewNodes{}, nil, api.Invalid("nodes", "node %q depends on itself", n.Name)
			case checkNodeName(d) != nil:
				return store.NewNodes{}, nil, api.Invalid("nodes", "node %q depends on %q, which is not a node name", n.Name, d)
			}
		}
		if d, ok := repeated(n.DependsOn); ok {
			return store.NewNodes{}, nil, api.Invalid("nodes", "node %q names %q twice in depends_on", n.Name, d)
		}
		add.DependsOn[i] = n.DependsOn
	}
	self := strings.TrimPrefix(string(holder), string(id)+"/")
	for name, news := range g.AddDependencies {
		switch {
		case isNew[name]:
			return store.NewNodes{}, nil, api.Invalid("add_dependencies", "%q is a new node: give its dependencies in its depends_on", name)
		case name == self:
			return store.NewNodes{}, nil, api.Invalid("add_dependencies", "%q is the running node: it has started", name)
		case len(news) == 0:
			return store.NewNodes{}, nil, api.Invalid("add_dependencies", "%q is given no new nodes to wait for", name)
		}
		for _, n := range news {
			if !isNew[n] {
				return store.NewNodes{}, nil, api.Invalid("add_dependencies", "%q would wait for %q, which is not one of the new nodes", name, n)
			}
		}
		if n, ok := repeated(news); ok {
			return store.NewNodes{}, nil, api.Invalid("add_dependencies", "%q names %q twice", name, n)
		}
	}
	return add, regs, nil
}

// repeated returns the first name of names that repeats an earlier one.
// Short lists are searched in place; long ones through a set, so that a
// node naming tens of thousands costs as many steps, not their square.
func repeated(names []string) (string, bool) {
	if len(names) <= 16 {
		for j, n := range names {
			if slices.Contains(names[:j], n) {
				return n, true
			}
		}
		return "", false
	}
	seen := make(map[string]struct{}, len(names))
	for _, n := range names {
		if _, ok := seen[n]; ok {
			return n, true
		}
		seen[n] = struct{}{}
	}
	return "", false
}

// GetWorkflow returns a workflow; see api.Workflows.
func (c *Client) GetWorkflow(ctx context.Context, id api.TaskID) (api.Workflow, error) {
	if err := spi.CheckTaskID("id", id); err != nil {
		return api.Workflow{}, fmt.Errorf("get workflow: %w", err)
	}
	t, err := c.st.Get(ctx, id)
	if err == nil && t.Behavior != api.WorkflowBehavior {
		err = api.ErrNotFound
	}
	if err != nil {
		return api.Workflow{}, fmt.Errorf("get workflow %s: %w", id, err)
	}
	nodes, err := c.st.WorkflowNodes(ctx, id)
	if err != nil {
		return api.Workflow{}, fmt.Errorf("get workflow %s: %w", id, unavailable(err))
	}
	return workflowOf(t, nodes), nil
}

// workflowOf builds a workflow from its task and nodes: its counts and
// its state (running while a node has not ended).
func workflowOf(t api.Task, nodes []store.WorkflowNode) api.Workflow {
	w := api.Workflow{ID: t.ID, Counts: map[api.Status]int{}, CreatedAt: t.CreatedAt, FinishedAt: t.FinishedAt,
		Nodes: make([]api.WorkflowNodeState, len(nodes))}
	ended := 0
	var codes codeCounts
	for _, n := range nodes {
		if n.Task.Finished() {
			ended++
		}
		w.Counts[n.Task.Status]++
		if n.Task.Finished() && n.Task.Status == api.StatusFailure && n.Task.Error != nil {
			codes.add(n.Task.Error.Code, 1)
		}
	}
	for i, n := range nodes {
		w.Nodes[i] = api.WorkflowNodeState{Name: n.Name, DependsOn: n.DependsOn, Rule: n.Rule, Finally: n.Finally, Task: n.Task}
	}
	w.ParentNode = workflowLinks(t, w.Nodes)
	w.Skipped = codes.skipped
	w.State = codes.state(ended == len(nodes), w.Counts[api.StatusFailure])
	return w
}

// codeCounts counts the failed nodes of a workflow that a rule skipped
// and that a cancel ended.
type codeCounts struct{ skipped, cancelled int }

func (c *codeCounts) add(code string, n int) {
	switch code {
	case api.CodeSkipped:
		c.skipped += n
	case api.CodeCancelled:
		c.cancelled += n
	}
}

// state is the state of a workflow from whether all its nodes ended and
// how many failed.
func (c codeCounts) state(allEnded bool, failed int) api.WorkflowState {
	switch {
	case !allEnded:
		return api.WorkflowRunning
	case c.cancelled > 0:
		return api.WorkflowCancelled
	case failed > c.skipped:
		return api.WorkflowFailed
	}
	return api.WorkflowSucceeded
}

// AwaitWorkflow waits for a workflow to end; see api.Workflows.
func (c *Client) AwaitWorkflow(ctx context.Context, id api.TaskID) (api.Workflow, error) {
	if _, err := c.GetWorkflow(ctx, id); err != nil {
		return api.Workflow{}, err
	}
	if _, err := c.Await(ctx, id); err != nil {
		return api.Workflow{}, fmt.Errorf("await workflow: %w", err)
	}
	return c.GetWorkflow(ctx, id)
}

// CancelWorkflow cancels a workflow; see api.Workflows.
func (c *Client) CancelWorkflow(ctx context.Context, id api.TaskID) error {
	return workflowOp(ctx, "cancel", id, func(ctx context.Context, id api.TaskID) error {
		_, err := c.st.CancelWorkflow(ctx, id)
		return err
	})
}

// RetryWorkflow runs an ended workflow's failed nodes again; see
// api.Workflows.
func (c *Client) RetryWorkflow(ctx context.Context, id api.TaskID) error {
	return workflowOp(ctx, "retry", id, func(ctx context.Context, id api.TaskID) error {
		_, err := c.st.RetryWorkflow(ctx, id)
		return err
	})
}

// HoldWorkflow holds a workflow; see api.Workflows.
func (c *Client) HoldWorkflow(ctx context.Context, id api.TaskID) error {
	return workflowOp(ctx, "hold", id, c.st.HoldWorkflow)
}

// ReleaseWorkflow releases a held workflow; see api.Workflows.
func (c *Client) ReleaseWorkflow(ctx context.Context, id api.TaskID) error {
	return workflowOp(ctx, "release", id, c.st.ReleaseWorkflow)
}

// RemoveWorkflow deletes a workflow; see api.Workflows.
func (c *Client) RemoveWorkflow(ctx context.Context, id api.TaskID) error {
	return workflowOp(ctx, "remove", id, c.st.RemoveWorkflow)
}

// workflowOp checks id and runs op on it, a store's operation on a
// workflow: its ErrNotFound and ErrConflict pass as they are, other errors
// mean the database is unavailable.
func workflowOp(ctx context.Context, verb string, id api.TaskID, op func(context.Context, api.TaskID) error) error {
	if err := spi.CheckTaskID("id", id); err != nil {
		return fmt.Errorf("%s workflow: %w", verb, err)
	}
	if err := op(ctx, id); err != nil {
		if errors.Is(err, api.ErrNotFound) || errors.Is(err, api.ErrConflict) {
			return err
		}
		return unavailable(err)
	}
	return nil
}

// WorkflowResult is the result of a workflow's own task: its state and
// node counts once every node ended.
type WorkflowResult struct {
	State   api.WorkflowState  `json:"state"`
	Counts  map[api.Status]int `json:"counts"`
	Skipped int                `json:"skipped"`
}

// workflowRunner is api.WorkflowBehavior: its run records the outcome of
// a workflow whose nodes all ended, a failure when a node failed or the
// workflow was cancelled.
type workflowRunner struct{}

// tally sums a workflow's node counts into its state, its counts per
// status and its skipped nodes.
func tally(counts []store.WorkflowCount) WorkflowResult {
	res := WorkflowResult{Counts: map[api.Status]int{}}
	var codes codeCounts
	allEnded := true
	for _, c := range counts {
		res.Counts[c.Status] += c.N
		allEnded = allEnded && (c.Status == api.StatusSuccess || c.Status == api.StatusFailure)
		if c.Status == api.StatusFailure {
			codes.add(c.Code, c.N)
		}
	}
	res.Skipped = codes.skipped
	res.State = codes.state(allEnded, res.Counts[api.StatusFailure])
	return res
}

// workflowParams are the params of a workflow's own task.
type workflowParams struct {
	// Finally names the workflow's finally node, if it has one: the
	// nodes added while it runs become its dependencies too.
	Finally string `json:"finally,omitempty"`
	// Grown is set by the store once a node added nodes at run time.
	Grown bool `json:"grown,omitempty"`
	// Parent is the node that runs the workflow as its sub-workflow.
	Parent api.TaskID `json:"parent,omitempty"`
}

var workflowKind = api.Kind[workflowParams, WorkflowResult]{ID: api.WorkflowBehavior}

func (workflowRunner) Kind() api.Kind[workflowParams, WorkflowResult] { return workflowKind }

func (workflowRunner) TaskID(ids spi.IDs, _ workflowParams) api.TaskID { return ids.Unique() }

func (workflowRunner) Run(ctx context.Context, rc spi.RunContext, _ workflowParams) (WorkflowResult, error) {
	st := rc.(*runContext).s.st
	counts, err := st.WorkflowCounts(ctx, rc.TaskID())
	if err != nil {
		return WorkflowResult{}, err
	}
	res := tally(counts)
	switch res.State {
	case api.WorkflowRunning:
		return res, spi.Snooze(rc.(*runContext).s.cfg.PollInterval)
	case api.WorkflowFailed, api.WorkflowCancelled:
		return res, &api.TaskError{Code: "workflow_" + string(res.State),
			Message: fmt.Sprintf("workflow %s: %d of its nodes failed, %d skipped", res.State, res.Counts[api.StatusFailure]-res.Skipped, res.Skipped)}
	}
	return res, nil
}
