package store

import (
	"context"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/stinthq/stint/api"
)

// NewWorkflow is a validated workflow to store: the task that stands for
// it, its nodes, and the edges between them.
type NewWorkflow struct {
	// Task is the workflow's own task (behavior api.WorkflowBehavior),
	// the parent of every node.
	Task NewTask
	// Nodes are the nodes' tasks, with ParentID set to Task.ID.
	Nodes []NewTask
	// Names are the nodes' names, Rules their rules, in Nodes' order.
	Names []string
	Rules []api.Rule
	// DependsOn lists, per node, the indexes in Nodes of its
	// dependencies, each once.
	DependsOn [][]int
}

// WorkflowOutcome is what Workflows.SubmitWorkflows did with one
// workflow.
type WorkflowOutcome struct {
	// Created is false when a task of the workflow's id existed, or the
	// workflow was refused: nothing of it was stored then.
	Created bool
	// Err is why the workflow was refused, nil when it was not.
	Err error
}

// RuleFinally is the stored rule of a workflow's finally node:
// api.RuleAllEnded on every other node, marked so that nodes added while
// the workflow runs join its dependencies.
const RuleFinally api.Rule = "finally"

// NewNodes are validated nodes that a running node adds to its workflow
// (see Workflows.GrowWorkflow).
type NewNodes struct {
	// Nodes are the new nodes' tasks, with ParentID set to the workflow.
	Nodes []NewTask
	// Names are the new nodes' names, Rules their rules, in Nodes' order.
	Names []string
	Rules []api.Rule
	// DependsOn lists, per new node, the names of its dependencies, new
	// or existing, each once.
	DependsOn [][]string
	// AddDependencies maps existing nodes' names to new nodes' names they
	// must wait for as well.
	AddDependencies map[string][]string
}

// WorkflowCount counts the nodes of a workflow in one state.
type WorkflowCount struct {
	Status api.Status
	// Code is the error code of failed nodes (api.CodeSkipped,
	// api.CodeCancelled, or the run's own); empty otherwise.
	Code string
	N    int
}

// WorkflowNode is a stored node: its task, name, rule and dependencies'
// names.
type WorkflowNode struct {
	Task      api.Task
	Name      string
	Rule      api.Rule
	Finally   bool
	DependsOn []string
}

// Workflows is what a store keeps of workflows: graphs of tasks whose
// nodes wait for their dependencies. Finish wakes or skips the
// dependents of the nodes it ends, in its own transaction.
type Workflows interface {
	// SubmitWorkflow stores a workflow, in tx when it is not nil. created
	// is false when a task of the workflow's id exists: nothing is stored
	// then. A node whose id is taken by a task of another workflow or by
	// none is an error wrapping api.ErrInvalid, and nothing is stored.
	SubmitWorkflow(ctx context.Context, tx pgx.Tx, wf NewWorkflow) (created bool, err error)
	// SubmitWorkflows stores workflows as SubmitWorkflow does, in tx
	// when it is not nil, each on its own terms but together: one
	// statement and one commit when none is refused. out[i] is the
	// outcome of wfs[i]: Created false when a task of its id exists (an
	// Err wrapping api.ErrConflict when that task is not a workflow), an
	// Err wrapping api.ErrInvalid when a node's id is taken by another
	// task; the other workflows are stored all the same. err is the
	// database's failing to serve the first statement: nothing is
	// stored then.
	SubmitWorkflows(ctx context.Context, tx pgx.Tx, wfs []NewWorkflow) (out []WorkflowOutcome, err error)
	// GrowWorkflow adds nodes to the workflow of the running node holder,
	// in tx when it is not nil, fenced by holder's lease (api.ErrHalt when
	// it no longer holds it). A graph the nodes would make bad (a name
	// taken, an unknown dependency, a cycle, naming its nodes) is an error
	// wrapping api.ErrInvalid; an existing node that has started cannot
	// get new dependencies (api.ErrConflict). Nothing is stored then.
	GrowWorkflow(ctx context.Context, tx pgx.Tx, holder LeaseRef, workflow api.TaskID, add NewNodes) error
	// WorkflowNodes returns the nodes of the workflow id, by name.
	WorkflowNodes(ctx context.Context, id api.TaskID) ([]WorkflowNode, error)
	// WorkflowCounts counts the nodes of the workflow id by status and
	// error code.
	WorkflowCounts(ctx context.Context, id api.TaskID) ([]WorkflowCount, error)
	// CancelWorkflow ends the nodes of workflow id that have not ended as
	// failed with code api.CodeCancelled (running ones halt at their next
	// fenced write), and releases the workflow when it is held, in one
	// transaction. It reports how many nodes it ended; api.ErrConflict
	// when they had all ended, api.ErrNotFound when there is no such
	// workflow.
	CancelWorkflow(ctx context.Context, id api.TaskID) (int, error)
	// HoldWorkflow holds the running workflow id: its nodes that wait to
	// run (scheduled, or waiting for a retry), and
	// those that become ready while it is held, wait until
	// ReleaseWorkflow; running nodes run on. Holding a held workflow does
	// nothing; api.ErrConflict when it ended, api.ErrNotFound when there
	// is none.
	HoldWorkflow(ctx context.Context, id api.TaskID) error
	// ReleaseWorkflow releases a held workflow and its held nodes.
	// Releasing a workflow that is not held does nothing; api.ErrConflict
	// when it ended, api.ErrNotFound when there is none.
	ReleaseWorkflow(ctx context.Context, id api.TaskID) error
	// RemoveWorkflow deletes the workflow id with its nodes and edges, in
	// one transaction; running nodes halt at their next fenced write.
	// api.ErrNotFound when there is none.
	RemoveWorkflow(ctx context.Context, id api.TaskID) error
	// RetryWorkflow runs the failed, skipped and cancelled nodes of the
	// ended workflow id again, keeping the results of those that
	// succeeded, and reports how many. api.ErrConflict when a node has
	// not ended or none failed; api.ErrNotFound when there is none.
	RetryWorkflow(ctx context.Context, id api.TaskID) (int, error)
	// ListWorkflows returns a page of the workflows' own tasks matching
	// f, in id order, reading no other task, nor their params, results
	// and progress. f is valid. A task that has
	// not finished while every node of its workflow ended (children
	// pending 0) has not yet recorded the outcome: it matches every final
	// state, and the caller counts the nodes to tell which.
	ListWorkflows(ctx context.Context, f api.WorkflowFilter) (api.Page, error)
}

// WorkflowCancelledCode is the error code of a cancelled workflow's own
// task; a failed workflow's task has another.
const WorkflowCancelledCode = "workflow_" + string(api.WorkflowCancelled)

// WorkflowState is the state of a workflow as its own task t recorded it:
// running until t finished (api.Task.Finished), then succeeded, or
// cancelled or failed by t's error code. A t that has not finished while
// no node is pending has not recorded the outcome yet: it is running here.
func WorkflowState(t api.Task) api.WorkflowState {
	switch {
	case !t.Finished():
		return api.WorkflowRunning
	case t.Status == api.StatusSuccess:
		return api.WorkflowSucceeded
	case t.Error != nil && t.Error.Code == WorkflowCancelledCode:
		return api.WorkflowCancelled
	}
	return api.WorkflowFailed
}

// FindCycle returns the nodes of a cycle of the graph whose node i depends
// on deps[i], the first node repeated at the end; nil when there is none.
// It peels off the nodes whose dependencies are all peeled (Kahn's
// algorithm); the nodes left each depend on another left one, so walking
// from any of them must come back to a node already seen.
func FindCycle(deps [][]int) []int {
	n := len(deps)
	pending := make([]int, n)
	dependents := make([][]int, n)
	for i, ds := range deps {
		pending[i] = len(ds)
		for _, d := range ds {
			dependents[d] = append(dependents[d], i)
		}
	}
	ready := make([]int, 0, n)
	for i := range n {
		if pending[i] == 0 {
			ready = append(ready, i)
		}
	}
	for k := 0; k < len(ready); k++ {
		for _, t := range dependents[ready[k]] {
			if pending[t]--; pending[t] == 0 {
				ready = append(ready, t)
			}
		}
	}
	if len(ready) == n {
		return nil
	}
	start := slices.IndexFunc(pending, func(p int) bool { return p > 0 })
	seen := map[int]int{}
	var path []int
	for at := start; ; {
		if k, ok := seen[at]; ok {
			return append(path[k:], at)
		}
		seen[at] = len(path)
		path = append(path, at)
		at = deps[at][slices.IndexFunc(deps[at], func(d int) bool { return pending[d] > 0 })]
	}
}
