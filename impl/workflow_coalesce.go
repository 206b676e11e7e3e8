package impl

// Concurrent workflow submits share statements: each SubmitWorkflow
// outside a caller's transaction joins a batch, and a batch goes out as
// one statement and one commit (store.Workflows.SubmitWorkflows), as
// single submits do (coalesce.go).

import (
	"context"
	"fmt"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/store"
)

// A batch of workflows is full, and goes out at once even while another
// is in the database, when it holds maxCoalescedWorkflows workflows or
// maxCoalescedNodes nodes. A workflow of more nodes goes in a batch of
// its own.
const (
	maxCoalescedWorkflows = 1000
	maxCoalescedNodes     = 10_000
)

// The SubmitWorkflow calls of a Client share batches (Client.workflows,
// a batchQueue) keyed by the workflow's id: a submit of an id in the open
// batch joins a later one, so that the second stores nothing (Created
// false), as it would one after the other. The store takes a batch's rows
// in id order. A workflow is validated (and its rate limits checked)
// before it joins: a refused request never reaches a batch. Each workflow
// of a batch is decided on its own (see store.Workflows.SubmitWorkflows):
// an id taken by a task that is not a workflow is refused by the
// statement itself, row by row; a statement refused for a row (a node's
// id taken by another task) is sent again in halves, down to the workflow
// at fault, which alone gets the error.
func (c *Client) workflowBatches() batchKind[*coalescedWorkflow] {
	return batchKind[*coalescedWorkflow]{
		send:       c.sendWorkflows,
		key:        func(e *coalescedWorkflow) (api.TaskID, bool) { return e.wf.Task.ID, true },
		weight:     func(e *coalescedWorkflow) int { return len(e.wf.Nodes) },
		maxEntries: maxCoalescedWorkflows,
		maxWeight:  maxCoalescedNodes,
	}
}

// coalescedWorkflow is one workflow submit in a batch.
type coalescedWorkflow struct {
	queued
	wf      store.NewWorkflow
	created bool
	err     error
}

// submitWorkflowCoalesced stores wf in a batch with the concurrent
// workflow submits of c; see workflowBatches. It reports whether wf was
// created.
func (c *Client) submitWorkflowCoalesced(ctx context.Context, wf store.NewWorkflow) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, fmt.Errorf("submit workflow %s: %w", wf.Task.ID, err)
	}
	e := &coalescedWorkflow{wf: wf}
	if !c.workflows.do(ctx, e) {
		return false, fmt.Errorf("submit workflow %s: not sent: %w", wf.Task.ID, ctx.Err())
	}
	return e.created, e.err
}

// sendWorkflows stores a batch's workflows and gives each entry its
// outcome.
func (c *Client) sendWorkflows(ctx context.Context, entries []*coalescedWorkflow) {
	wfs := make([]store.NewWorkflow, len(entries))
	for i, e := range entries {
		wfs[i] = e.wf
	}
	out, err := c.st.SubmitWorkflows(ctx, nil, wfs)
	for i, e := range entries {
		if err != nil {
			e.err = unavailable(err)
			continue
		}
		e.created, e.err = out[i].Created, out[i].Err
	}
}
