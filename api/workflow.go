package api

import (
	"context"
	"time"
)

// StatusWaiting is a workflow node whose rule does not yet allow it to
// run: its dependencies have not ended as the rule needs. The finish of
// its last needed dependency makes it scheduled, or ends it (a failure
// with error code CodeSkipped) when its rule can no longer be met.
const StatusWaiting Status = "waiting"

// Rule says when a workflow node may run, from its dependencies'
// outcomes. A dependency's outcome is success, failed (it failed for good
// after its retries, or was cancelled) or skipped (a rule of its own ended
// it without running).
type Rule string

// The rules of a workflow node.
const (
	// RuleAllSucceeded, the default, runs the node once every dependency
	// succeeded, and skips it as soon as one failed or was skipped.
	RuleAllSucceeded Rule = "all_succeeded"
	// RuleAllEnded runs the node once every dependency ended, whatever
	// its outcome: a cleanup step.
	RuleAllEnded Rule = "all_ended"
	// RuleAnySucceeded runs the node as soon as one dependency succeeded,
	// and skips it when all ended and none succeeded.
	RuleAnySucceeded Rule = "any_succeeded"
	// RuleNoneFailed runs the node once every dependency ended and none
	// failed (a skipped one is fine), and skips it as soon as one failed.
	RuleNoneFailed Rule = "none_failed"
)

// Valid reports whether r is one of the rules; the empty rule is
// RuleAllSucceeded.
func (r Rule) Valid() bool {
	switch r {
	case "", RuleAllSucceeded, RuleAllEnded, RuleAnySucceeded, RuleNoneFailed:
		return true
	}
	return false
}

// Error codes (TaskError.Code) of the workflow nodes that ended without
// running.
const (
	// CodeSkipped ends a node whose rule can no longer be met; the
	// message names the dependency that decided it.
	CodeSkipped = "skipped"
	// CodeCancelled ends a node of a cancelled workflow that had not
	// started.
	CodeCancelled = "cancelled"
)

// MaxWorkflowNodes is the most nodes one workflow may have, those its
// running nodes add (WorkflowGrowth) included. A workflow of this many
// nodes is tested to run through.
const MaxWorkflowNodes = 100_000

// WorkflowBehavior is the behavior of the task that stands for a workflow:
// the parent of its nodes, which ends once they all ended, succeeded when
// none failed. Every server runs it.
const WorkflowBehavior BehaviorID = "stint.workflow"

// GateBehavior is the behavior of a workflow's gate nodes
// (WorkflowNode.Gate). Every server runs it.
const GateBehavior BehaviorID = "stint.gate"

// SubworkflowBehavior is the behavior of the workflow nodes that run a
// whole workflow (WorkflowNode.Workflow). Every server runs it.
const SubworkflowBehavior BehaviorID = "stint.subworkflow"

// Gate is a workflow node that waits for a signal.
type Gate struct {
	// Topic is the signal's topic: 1 to 128 characters from A-Z a-z 0-9
	// . _ : / -.
	Topic string `json:"topic"`
	// Timeout is the longest the gate waits, from its start (once its
	// dependencies let it run). Required; at most 100 years. In JSON, a
	// Go duration string ("72h0m0s").
	Timeout time.Duration `json:"timeout"`
}

// WorkflowRequest asks for a workflow: a graph of tasks stored at once, or
// not at all.
type WorkflowRequest struct {
	// ID names the workflow; its nodes' task ids are ID + "/" + their
	// name. Empty generates one. A second submit of an existing workflow's
	// id stores nothing and shares the first (WorkflowSubmission.Created
	// is false). 3 to 63 characters from A-Z a-z 0-9 . _ : @ + = -.
	ID TaskID `json:"id,omitempty"`
	// Nodes are the workflow's tasks; at least one, at most
	// MaxWorkflowNodes.
	Nodes []WorkflowNode `json:"nodes"`
	// Trace is the submitter's W3C traceparent, given to every node
	// that has none of its own.
	Trace string `json:"trace,omitempty"`
	// Retention keeps the workflow, its nodes with it, this long after it
	// ended, whatever its outcome, instead of the retention of
	// stint.workflow (7 days, 30 for a workflow that failed). Zero leaves
	// it to stint.workflow. A node leaves with its workflow at the latest;
	// one with a retention of its own (its Task.Retention) leaves once
	// that passed after the workflow ended, never while it runs (its
	// dependents' rules and NodeResult read it). The nodes that stay
	// still name it among their DependsOn, and a workflow that lost a
	// node another depends on cannot be retried (ErrConflict). In
	// JSON, a Go duration string ("24h0m0s").
	Retention time.Duration `json:"retention,omitempty"`
}

// WorkflowNode is one task of a workflow.
type WorkflowNode struct {
	// Name is unique in the workflow: 1 to 64 characters from A-Z a-z
	// 0-9 . _ -.
	Name string `json:"name"`
	// Task is the task to run: its behavior, params and options. Its ID
	// must be empty (the node's id is its workflow's and its name). Its
	// Delay applies to a node without dependencies; a node with some is
	// due when its rule lets it run.
	Task SubmitRequest `json:"task"`
	// DependsOn names the nodes that must end first, as Rule says.
	DependsOn []string `json:"depends_on,omitempty"`
	// Rule says when the node runs. Empty is RuleAllSucceeded.
	Rule Rule `json:"rule,omitempty"`
	// Finally makes the node run once after every other node ended,
	// whatever happened (RuleAllEnded on all of them). At most one node
	// of a workflow; it may not name DependsOn nor have dependents.
	Finally bool `json:"finally,omitempty"`
	// Gate makes the node wait for a signal instead of running a
	// behavior (leave Task's behavior and params empty): an approval, a
	// webhook. Once its dependencies let it run, it succeeds with the
	// first message of the gate's topic sent to its task id (the
	// workflow's id, "/", its name; see Signals.Signal), sent before or
	// after it started, as its result, or fails with the code "timeout"
	// when none came within the gate's Timeout; its dependents decide by
	// their rules as for any node.
	Gate *Gate `json:"gate,omitempty"`
	// Workflow makes the node run a whole workflow, a sub-workflow,
	// instead of a behavior (leave Task's behavior and params empty; its
	// other options apply to the node): once its dependencies let it run,
	// the node submits the workflow, under an id derived from its own
	// (the request's ID must be empty), waits for it holding no worker
	// (spi.WaitForTasks), and ends with its outcome: a success with its
	// result (a workflow's result: its state and counts), or a failure
	// with its error (code "workflow_failed" or "workflow_cancelled").
	// A run of the node again (a retry, a take-over) finds the workflow
	// it submitted rather than submitting another; a run after a retry
	// of the node's workflow (RetryWorkflow) retries the sub-workflow's
	// failed nodes and waits again. The request is validated with the
	// node's and counts as its params (at most 1 MiB). Workflow.ParentNode
	// and WorkflowNodeState.Workflow link the two.
	Workflow *WorkflowRequest `json:"workflow,omitempty"`
}

// WorkflowGrowth is what a running node adds to its own workflow (see
// spi.RunContext.AddNodes): a fan-out whose width is known only at run
// time. It is validated as a submit is, against the whole graph.
type WorkflowGrowth struct {
	// Nodes are the nodes to add: names new in the workflow, DependsOn
	// naming new or existing nodes (the running one included). None may
	// be Finally: the workflow's finally node, when it has one, waits for
	// the new nodes too.
	Nodes []WorkflowNode `json:"nodes"`
	// AddDependencies maps the name of an existing node that has not
	// started (waiting, or scheduled and not yet claimed) to new nodes it
	// must wait for as well, under its own rule: the merge step of a
	// fan-out submitted before its width was known.
	AddDependencies map[string][]string `json:"add_dependencies,omitempty"`
}

// WorkflowSubmission is what a workflow submit did.
type WorkflowSubmission struct {
	// ID is the workflow's id: the id of the task that stands for it.
	ID TaskID `json:"id"`
	// Created is false when a workflow of this id existed: nothing was
	// stored.
	Created bool `json:"created"`
	// Nodes maps each node's name to its task id.
	Nodes map[string]TaskID `json:"nodes,omitempty"`
}

// WorkflowState is the state of a workflow as a whole.
type WorkflowState string

// The states of a workflow.
const (
	// WorkflowRunning has nodes that have not ended.
	WorkflowRunning WorkflowState = "running"
	// WorkflowSucceeded ended with no node failed.
	WorkflowSucceeded WorkflowState = "succeeded"
	// WorkflowFailed ended with a node failed (skipped ones do not count).
	WorkflowFailed WorkflowState = "failed"
	// WorkflowCancelled was cancelled.
	WorkflowCancelled WorkflowState = "cancelled"
)

// Workflow is the stored state of a workflow.
type Workflow struct {
	ID    TaskID        `json:"id"`
	State WorkflowState `json:"state"`
	// Counts counts the nodes per status; skipped and cancelled nodes
	// count as failure.
	Counts map[Status]int `json:"counts"`
	// Skipped counts the nodes a rule ended without running.
	Skipped int `json:"skipped"`
	// Nodes are the workflow's nodes, by name.
	Nodes []WorkflowNodeState `json:"nodes"`
	// ParentNode is the node (its task id) of another workflow that runs
	// this one as its sub-workflow (WorkflowNode.Workflow); empty for a
	// workflow submitted on its own.
	ParentNode TaskID     `json:"parent_node,omitempty"`
	CreatedAt  time.Time  `json:"created_at"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
}

// Valid reports whether s is one of the workflow states.
func (s WorkflowState) Valid() bool {
	switch s {
	case WorkflowRunning, WorkflowSucceeded, WorkflowFailed, WorkflowCancelled:
		return true
	}
	return false
}

// Ended reports whether the workflow reached a final state.
func (w Workflow) Ended() bool { return w.State != WorkflowRunning }

// Node returns the node of w named name.
func (w Workflow) Node(name string) (WorkflowNodeState, bool) {
	for _, n := range w.Nodes {
		if n.Name == name {
			return n, true
		}
	}
	return WorkflowNodeState{}, false
}

// WorkflowNodeState is a node of a stored workflow.
type WorkflowNodeState struct {
	Name      string   `json:"name"`
	DependsOn []string `json:"depends_on,omitempty"`
	Rule      Rule     `json:"rule"`
	// Finally marks the workflow's finally node (its Rule is
	// RuleAllEnded, on every other node).
	Finally bool `json:"finally,omitempty"`
	// Task is the node's task. A waiting node's Task.Waiting names the
	// dependencies it waits on.
	Task Task `json:"task"`
	// Workflow is the id of the sub-workflow the node runs
	// (WorkflowNode.Workflow), submitted once the node starts; empty for
	// other nodes.
	Workflow TaskID `json:"workflow,omitempty"`
}

// WorkflowFilter selects workflows for ListWorkflows. Zero fields match
// everything.
type WorkflowFilter struct {
	// State selects the workflows in one state.
	State WorkflowState `json:"state,omitempty"`
	// After is the keyset cursor: only workflows with a greater id. Pass
	// the previous page's Next.
	After TaskID `json:"after,omitempty"`
	// Limit caps the page size. Defaults to 100; at most 1000.
	Limit int `json:"limit,omitempty"`
}

// WorkflowSummary is a workflow in a list: its state without its nodes.
// A workflow whose nodes all ended is listed in its final state, from its
// nodes' counts, before its own task records it.
type WorkflowSummary struct {
	ID    TaskID        `json:"id"`
	State WorkflowState `json:"state"`
	// Pending counts the nodes that have not ended.
	Pending int `json:"pending"`
	// Error is the outcome of a failed or cancelled workflow: how many of
	// its nodes failed and how many a rule skipped.
	Error      *TaskError `json:"error,omitempty"`
	CreatedAt  time.Time  `json:"created_at"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
}

// WorkflowPage is one page of ListWorkflows.
type WorkflowPage struct {
	Workflows []WorkflowSummary `json:"workflows"`
	// Next is the cursor for the next page; empty on the last page.
	Next TaskID `json:"next,omitempty"`
}

// Workflows submits and inspects workflows. Servers and client-only
// processes implement it alike.
type Workflows interface {
	// SubmitWorkflow stores a workflow whole, or nothing: a bad graph (a
	// cycle, naming its nodes; an unknown dependency; a duplicate name; a
	// self-dependency; no nodes or too many) or a bad node (an unknown
	// behavior, invalid params or options, naming the node) is an error
	// wrapping ErrInvalid.
	SubmitWorkflow(ctx context.Context, req WorkflowRequest) (WorkflowSubmission, error)
	// GetWorkflow returns a workflow with its nodes; ErrNotFound if there
	// is none of this id.
	GetWorkflow(ctx context.Context, id TaskID) (Workflow, error)
	// ListWorkflows returns the workflows matching f in id order, a page
	// at a time. A bad filter (an unknown state, a limit outside 0..1000,
	// a malformed cursor) is an error wrapping ErrInvalid.
	ListWorkflows(ctx context.Context, f WorkflowFilter) (WorkflowPage, error)
	// AwaitWorkflow waits until the workflow ended and returns it.
	AwaitWorkflow(ctx context.Context, id TaskID) (Workflow, error)
	// CancelWorkflow ends the nodes that have not ended as cancelled (a
	// running one halts at its next fenced write), in one transaction; the
	// workflow ends cancelled, held or not. ErrConflict when its nodes had
	// all ended, ErrNotFound if there is none.
	CancelWorkflow(ctx context.Context, id TaskID) error
	// HoldWorkflow holds a running workflow: its nodes that wait to run
	// (due, or waiting for a retry), and those that become ready while it
	// is held, wait until
	// ReleaseWorkflow; running nodes run on. Holding a held workflow does
	// nothing. ErrConflict when it ended, ErrNotFound when there is none.
	HoldWorkflow(ctx context.Context, id TaskID) error
	// ReleaseWorkflow releases a held workflow and its held nodes, each
	// due as it was. Releasing a workflow that is not held does nothing.
	// ErrConflict when it ended, ErrNotFound when there is none.
	ReleaseWorkflow(ctx context.Context, id TaskID) error
	// RemoveWorkflow deletes a workflow with all its nodes, in one
	// transaction: running nodes halt at their next fenced write, and
	// awaiters of the workflow or its nodes get ErrNotFound. ErrNotFound
	// when there is none.
	RemoveWorkflow(ctx context.Context, id TaskID) error
	// RetryWorkflow runs an ended workflow's failed, skipped and cancelled
	// nodes again, keeping the results of those that succeeded; each
	// waits again for its dependencies that run again. ErrConflict when
	// the workflow has not ended or no node failed.
	RetryWorkflow(ctx context.Context, id TaskID) error
}
