package impl

import (
	"context"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/spi"
)

// steps sets the steps kept of t (spi.Policy.KeepSteps), unless its
// behavior is registered here and keeps none, or is the workflows', which
// never checkpoints: a read spared for most tasks.
func (c *Client) steps(ctx context.Context, t *api.Task) error {
	if reg, ok := c.reg.Lookup(t.Behavior); (ok && !reg.Policy.KeepSteps) || t.Behavior == api.WorkflowBehavior {
		return nil
	}
	steps, err := c.st.Steps(ctx, t.ID)
	if err != nil {
		return unavailable(err)
	}
	t.Steps = steps
	return nil
}

// checkStep checks the task id and the step of a rewind or a fork.
func checkStep(id api.TaskID, step int) error {
	if err := spi.CheckTaskID("id", id); err != nil {
		return err
	}
	if step < 1 {
		return api.Invalid("step", "%d is below 1: steps are numbered from 1", step)
	}
	return nil
}

// Rewind runs a task that finished for good again from one of its steps;
// see api.Operator.
func (c *Client) Rewind(ctx context.Context, id api.TaskID, step int) error {
	if err := checkStep(id, step); err != nil {
		return err
	}
	if err := c.st.Rewind(ctx, id, step); err != nil {
		return err
	}
	c.kick.kick(false)
	return nil
}

// Fork submits a copy of a task started from one of its steps; see
// api.Operator.
func (c *Client) Fork(ctx context.Context, id api.TaskID, step int, newID api.TaskID) (api.Submission, error) {
	if err := checkStep(id, step); err != nil {
		return api.Submission{}, err
	}
	if err := spi.CheckTaskID("new_id", newID); err != nil {
		return api.Submission{}, err
	}
	sub, err := c.st.Fork(ctx, id, step, newID)
	if err != nil {
		return sub, err
	}
	c.kick.kick(false)
	return sub, nil
}
