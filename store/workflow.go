package store

import (
	"context"

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
	// WorkflowNodes returns the nodes of the workflow id, by name.
	WorkflowNodes(ctx context.Context, id api.TaskID) ([]WorkflowNode, error)
	// WorkflowCounts counts the nodes of the workflow id by status and
	// error code.
	WorkflowCounts(ctx context.Context, id api.TaskID) ([]WorkflowCount, error)
	// CancelWorkflow ends the waiting and scheduled nodes of workflow id
	// as failed with code api.CodeCancelled, and removes its running ones
	// (their runs halt at their next fenced write), in one transaction.
	// It reports how many nodes it ended; api.ErrNotFound when there is no
	// such workflow.
	CancelWorkflow(ctx context.Context, id api.TaskID) (int, error)
	// RetryWorkflow runs the failed, skipped and cancelled nodes of the
	// ended workflow id again, keeping the results of those that
	// succeeded, and reports how many. api.ErrConflict when a node has
	// not ended or none failed; api.ErrNotFound when there is none.
	RetryWorkflow(ctx context.Context, id api.TaskID) (int, error)
	// ListWorkflows returns a page of the workflows' own tasks matching
	// f, in id order, reading no other task. f is valid. A task that has
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
