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

// newTaskActionCmds returns `stint tasks hold|release|retry|fail|rm`: the
// operator actions on one task.
func (c *cli) newTaskActionCmds() []*cobra.Command {
	type action struct {
		use, short, done string
		do               func(*impl.Client, context.Context, api.TaskID) error
	}
	var reason string
	actions := []action{
		{"hold", "Keep a scheduled task from running until it is released", "held", (*impl.Client).Hold},
		{"release", "Make a held task due again", "released", (*impl.Client).Release},
		{"retry", "Run a task that failed for good again, with fresh attempts", "scheduled to retry", (*impl.Client).Retry},
		{"fail", "Fail a waiting (scheduled or held) task for good, by hand, with --reason", "failed",
			func(client *impl.Client, ctx context.Context, id api.TaskID) error {
				return client.Fail(ctx, id, reason)
			}},
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
		if a.use == "fail" {
			cmd.Long = `Fail a task that waits to run (scheduled, held, or due again after a run) for
good. Its error says it was failed by hand, with the reason; its parent counts
it as ended, and its awaiters and subscribers see a final failure. A running
task is refused: its run owns its outcome (rm halts it). retry runs a failed
task again.`
			cmd.Example = `  stint tasks fail greeting-1 --reason "the source file is known to be corrupt"`
			cmd.Flags().StringVar(&reason, "reason", "", "why the task is failed (required; it is stored in the task's error)")
		}
		cmd.RunE = func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			id := api.TaskID(args[0])
			if err := spi.CheckTaskID("id", id); err != nil {
				return err
			}
			if a.use == "fail" && strings.TrimSpace(reason) == "" {
				return usageErrorf("--reason is required: say why the task is failed")
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
			case err != nil:
				// The store's error names the action, the task and, for
				// a conflict, its state (see classify).
				return c.schemaHint(err)
			}
			fmt.Fprintf(c.stdout, "task %s %s\n", id, a.done)
			return nil
		}
		cmds = append(cmds, cmd)
	}
	return cmds
}
