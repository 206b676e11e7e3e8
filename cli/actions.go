package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/spi"
)

// newTaskActionCmds returns `stint tasks hold|release|retry|rm`: the
// operator actions on one task.
func (c *cli) newTaskActionCmds() []*cobra.Command {
	type action struct {
		use, short, done string
		do               func(*impl.Client, context.Context, api.TaskID) error
	}
	actions := []action{
		{"hold", "Keep a scheduled task from running until it is released", "held", (*impl.Client).Hold},
		{"release", "Make a held task due again", "released", (*impl.Client).Release},
		{"retry", "Run a task that failed for good again, with fresh attempts", "scheduled to retry", (*impl.Client).Retry},
		{"rm", "Remove a task; a running one halts at its next write", "removed", (*impl.Client).Remove},
	}
	var cmds []*cobra.Command
	for _, a := range actions {
		cmd := &cobra.Command{
			Use:   a.use + " ID",
			Short: a.short,
			Args:  exactArgs(1, "ID"),
		}
		db := addDBFlag(cmd)
		cmd.RunE = func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			id := api.TaskID(args[0])
			if err := spi.CheckTaskID("id", id); err != nil {
				return err
			}
			client, closeClient, err := c.openClient(ctx, db)
			if err != nil {
				return err
			}
			defer closeClient()
			err = a.do(client, ctx, id)
			switch {
			case errors.Is(err, api.ErrNotFound):
				return fmt.Errorf("task %s not found", id)
			case errors.Is(err, api.ErrConflict):
				// The store's error names the action, the task and its
				// state; the sentinel's words add nothing to them.
				return &exitError{code: exitFailure, err: errors.New(strings.TrimSuffix(err.Error(), ": "+api.ErrConflict.Error()))}
			case err != nil:
				// The store's error names the action and the task.
				return schemaHint(err)
			}
			fmt.Fprintf(c.stdout, "task %s %s\n", id, a.done)
			return nil
		}
		cmds = append(cmds, cmd)
	}
	return cmds
}
