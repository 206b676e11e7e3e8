package impl

import (
	"context"
	"fmt"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/store"
)

// ListWorkflows returns a page of workflows; see api.Workflows.
func (c *Client) ListWorkflows(ctx context.Context, f api.WorkflowFilter) (api.WorkflowPage, error) {
	if f.State != "" && !f.State.Valid() {
		return api.WorkflowPage{}, api.Invalid("state", "%q is not a workflow state: want running, succeeded, failed or cancelled", f.State)
	}
	if f.Limit < 0 || f.Limit > 1000 {
		return api.WorkflowPage{}, api.Invalid("limit", "%d is outside 0..1000", f.Limit)
	}
	if f.After != "" {
		if err := spi.CheckTaskID("after", f.After); err != nil {
			return api.WorkflowPage{}, err
		}
	}
	page, err := c.st.ListWorkflows(ctx, f)
	if err != nil {
		return api.WorkflowPage{}, unavailable(err)
	}
	out := api.WorkflowPage{Workflows: make([]api.WorkflowSummary, 0, len(page.Tasks)), Next: page.Next}
	for _, t := range page.Tasks {
		s := api.WorkflowSummary{ID: t.ID, State: store.WorkflowState(t), Pending: t.ChildrenPending,
			CreatedAt: t.CreatedAt, FinishedAt: t.FinishedAt}
		if s.State == api.WorkflowRunning && t.ChildrenPending == 0 {
			// Its nodes all ended; its own task has not recorded it yet.
			if s.State, err = c.endedState(ctx, t.ID); err != nil {
				return api.WorkflowPage{}, fmt.Errorf("list workflows: %w", unavailable(err))
			}
		}
		if f.State != "" && s.State != f.State {
			continue
		}
		switch s.State {
		case api.WorkflowRunning:
			s.FinishedAt = nil
		case api.WorkflowFailed, api.WorkflowCancelled:
			if t.Finished() {
				s.Error = t.Error
			}
		}
		out.Workflows = append(out.Workflows, s)
	}
	return out, nil
}

// endedState is the state of the workflow id from its nodes' counts.
func (c *Client) endedState(ctx context.Context, id api.TaskID) (api.WorkflowState, error) {
	counts, err := c.st.WorkflowCounts(ctx, id)
	if err != nil {
		return "", err
	}
	return tally(counts).State, nil
}
