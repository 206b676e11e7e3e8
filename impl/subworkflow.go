package impl

// Sub-workflows (api.WorkflowNode.Workflow): a node whose task submits a
// whole workflow and ends with its outcome, waiting for it with
// spi.WaitForTasks.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/spi"
)

// subworkflowParams are the params of a sub-workflow node's task.
type subworkflowParams struct {
	// Workflow is the sub-workflow, its ID derived from the node's
	// (subworkflowID).
	Workflow api.WorkflowRequest `json:"workflow"`
}

// subworkflowProgress is a sub-workflow node's checkpoint.
type subworkflowProgress struct {
	// Submitted is set once a run of the node submitted the sub-workflow:
	// a later run that finds none, finds it removed.
	Submitted bool `json:"submitted,omitempty"`
	// Failed is when the sub-workflow ended in the failure the node last
	// ended with. A run that finds that failure still was started by a
	// retry of the node's workflow, and retries the sub-workflow.
	Failed *time.Time `json:"failed,omitempty"`
}

var subworkflowKind = api.Kind[subworkflowParams, WorkflowResult]{ID: api.SubworkflowBehavior}

// subworkflowWait is the longest a node sleeps before it looks at its
// sub-workflow again: the sub-workflow's end wakes it before.
const subworkflowWait = 24 * time.Hour

// subworkflowSubmitted, when set (by tests), is called once a run of the
// node node submitted its sub-workflow, with whether the submit created
// it; an error it returns ends the run.
var subworkflowSubmitted atomic.Pointer[func(node api.TaskID, created bool) error]

// subworkflowID returns the id of the sub-workflow of the node node: the
// same for every run of it, so that a run again finds the workflow an
// earlier one submitted. It is a valid workflow id for any node id.
func subworkflowID(node api.TaskID) api.TaskID {
	return spi.NewIDs(api.SubworkflowBehavior).Deterministic(string(node))
}

// subworkflowRunner is api.SubworkflowBehavior: its run submits the
// node's sub-workflow unless it exists, sleeps until it ended, and ends
// with its outcome.
type subworkflowRunner struct{}

func (subworkflowRunner) Kind() api.Kind[subworkflowParams, WorkflowResult] { return subworkflowKind }

func (subworkflowRunner) TaskID(ids spi.IDs, _ subworkflowParams) api.TaskID { return ids.Unique() }

func (subworkflowRunner) Run(ctx context.Context, rc spi.RunContext, p subworkflowParams) (WorkflowResult, error) {
	c := rc.(*runContext).s.Client
	id := subworkflowID(rc.TaskID())
	var pr subworkflowProgress
	if _, err := rc.Progress(&pr); err != nil {
		return WorkflowResult{}, err
	}
	wait := func() (WorkflowResult, error) {
		if err := rc.Checkpoint(ctx, pr); err != nil {
			return WorkflowResult{}, err
		}
		return WorkflowResult{}, spi.WaitForTasks([]api.TaskID{id}, subworkflowWait)
	}
	t, err := c.st.Get(ctx, id)
	switch {
	case errors.Is(err, api.ErrNotFound) && pr.Submitted:
		return WorkflowResult{}, api.Permanent("workflow_removed", "sub-workflow %s was removed", id)
	case errors.Is(err, api.ErrNotFound):
		req := p.Workflow
		req.ID = id
		sub, err := c.submitWorkflow(ctx, nil, req, rc.TaskID())
		if errors.Is(err, api.ErrInvalid) {
			return WorkflowResult{}, api.Permanent("invalid_params", "sub-workflow %s: %v", id, err)
		}
		if err != nil {
			return WorkflowResult{}, err
		}
		if hook := subworkflowSubmitted.Load(); hook != nil {
			if err := (*hook)(rc.TaskID(), sub.Created); err != nil {
				return WorkflowResult{}, err
			}
		}
		pr.Submitted = true
		return wait()
	case err != nil:
		return WorkflowResult{}, err
	case t.Behavior != api.WorkflowBehavior:
		return WorkflowResult{}, api.Permanent("invalid_params", "task %s, the sub-workflow's id, is of behavior %s", id, t.Behavior)
	case !t.Finished():
		pr.Submitted = true
		return wait()
	case t.Status == api.StatusSuccess:
		var res WorkflowResult
		if err := json.Unmarshal(t.Result, &res); err != nil {
			return WorkflowResult{}, fmt.Errorf("decode the result of sub-workflow %s: %w", id, err)
		}
		return res, nil
	case pr.Failed != nil && t.FinishedAt != nil && pr.Failed.Equal(*t.FinishedAt):
		// This run follows a retry of the node's workflow.
		if err := c.RetryWorkflow(ctx, id); err != nil {
			return WorkflowResult{}, fmt.Errorf("retry sub-workflow %s: %w", id, err)
		}
		pr.Failed = nil
		return wait()
	}
	pr.Submitted, pr.Failed = true, t.FinishedAt
	if err := rc.Checkpoint(ctx, pr); err != nil {
		return WorkflowResult{}, err
	}
	te := api.Permanent("workflow_failed", "sub-workflow %s failed", id)
	if t.Error != nil {
		te = api.Permanent(t.Error.Code, "sub-workflow %s: %s", id, t.Error.Message)
	}
	return WorkflowResult{}, te
}

// subworkflowTask returns the task of node i, n, of the workflow id, a
// sub-workflow node, checked as its workflow would be at its submit; trace
// is the workflow's traceparent, the sub-workflow's unless it has one.
func (c *Client) subworkflowTask(id api.TaskID, i int, n api.WorkflowNode, trace string) (api.SubmitRequest, error) {
	switch {
	case n.Gate != nil:
		return api.SubmitRequest{}, api.Invalid("nodes", "node %q: a node is a gate or runs a workflow, not both", n.Name)
	case n.Task.Behavior != "" || len(n.Task.Params) > 0:
		return api.SubmitRequest{}, api.Invalid("nodes", "node %q: a sub-workflow's node runs no behavior: leave task's behavior and params empty", n.Name)
	case n.Workflow.ID != "":
		return api.SubmitRequest{}, api.Invalid("nodes", "node %q: workflow.id must be empty: a sub-workflow's id is derived from its node's", n.Name)
	}
	req := *n.Workflow
	req.ID = subworkflowID(id + "/" + api.TaskID(n.Name))
	if req.Trace == "" {
		req.Trace = trace
	}
	if _, _, err := c.prepareWorkflow(req); err != nil {
		var ie *api.InvalidError
		if !errors.As(err, &ie) {
			return api.SubmitRequest{}, fmt.Errorf("node %q: workflow: %w", n.Name, err)
		}
		return api.SubmitRequest{}, &api.InvalidError{Field: fmt.Sprintf("nodes[%d].workflow.%s", i, ie.Field),
			Reason: fmt.Sprintf("%s (sub-workflow of node %q)", ie.Reason, n.Name), Err: ie.Unwrap()}
	}
	params, err := json.Marshal(subworkflowParams{Workflow: req})
	if err != nil {
		return api.SubmitRequest{}, fmt.Errorf("node %q: encode workflow: %w", n.Name, err)
	}
	t := n.Task
	t.Behavior, t.Params = api.SubworkflowBehavior, params
	return t, nil
}

// withParent returns the params of a workflow's own task, params, naming
// the node parent that runs it as its sub-workflow.
func withParent(params json.RawMessage, parent api.TaskID) (json.RawMessage, error) {
	var p workflowParams
	if err := json.Unmarshal(params, &p); err != nil {
		return nil, fmt.Errorf("decode workflow params: %w", err)
	}
	p.Parent = parent
	return json.Marshal(p)
}

// workflowLinks returns the node that runs the workflow of task t as its
// sub-workflow, and sets on each of nodes that runs one its id.
func workflowLinks(t api.Task, nodes []api.WorkflowNodeState) api.TaskID {
	for i, n := range nodes {
		if n.Task.Behavior == api.SubworkflowBehavior {
			nodes[i].Workflow = subworkflowID(n.Task.ID)
		}
	}
	var p workflowParams
	if json.Unmarshal(t.Params, &p) != nil {
		return ""
	}
	return p.Parent
}
