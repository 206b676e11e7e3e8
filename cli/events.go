package cli

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/spi"
)

// newEventsCmd returns `stint events`: the events a task published, one
// of them, or a wait for one.
func (c *cli) newEventsCmd() *cobra.Command {
	var asJSON bool
	var wait time.Duration
	cmd := &cobra.Command{
		Use:   "events ID [KEY]",
		Short: "Show the events a task published, or wait for one",
		Long: `Show the events a task published (spi.RunContext.SetEvent): values under keys
of its own that it sets while it runs, such as "preview ready" or "50% done".
With KEY, show that event; with --wait, wait until the task sets it (exit 1
when the task finished without it or the wait ran out).`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 || len(args) > 2 {
				return usageErrorf("%s takes a task's ID and, optionally, a KEY, not %s", cmd.CommandPath(), quoteArgs(args))
			}
			return nil
		},
	}
	db := addDBFlag(cmd)
	addReadDBFlag(cmd, db)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the events as JSON")
	cmd.Flags().DurationVar(&wait, "wait", 0, "with KEY, wait up to this long for the task to set it")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		ctx := cmd.Context()
		id := api.TaskID(args[0])
		if err := spi.CheckTaskID("id", id); err != nil {
			return err
		}
		key := ""
		if len(args) == 2 {
			key = args[1]
		}
		if wait < 0 || (wait > 0 && key == "") {
			return usageErrorf("--wait takes a KEY and a duration above zero")
		}
		client, closeClient, err := c.openClient(ctx, db)
		if err != nil {
			return err
		}
		defer closeClient()
		var events []api.TaskEvent
		switch {
		case wait > 0:
			wctx, cancel := context.WithTimeout(ctx, wait)
			defer cancel()
			e, err := client.AwaitEvent(wctx, id, key)
			switch {
			case errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
				return fmt.Errorf("task %s did not set event %q within %s", id, key, wait)
			case err != nil:
				return fmt.Errorf("await event %q of task %s: %w", key, id, err)
			}
			events = []api.TaskEvent{e}
		case key != "":
			e, err := client.GetEvent(ctx, id, key)
			if err != nil {
				return fmt.Errorf("get event %q of task %s: %w", key, id, err)
			}
			events = []api.TaskEvent{e}
		default:
			t, err := client.Get(ctx, id)
			if errors.Is(err, api.ErrNotFound) {
				return fmt.Errorf("task %s not found", id)
			}
			if err != nil {
				return fmt.Errorf("get task %s: %w", id, c.schemaHint(err))
			}
			events = t.Events
		}
		if asJSON {
			if events == nil {
				events = []api.TaskEvent{}
			}
			return writeJSON(c.stdout, struct {
				Events []api.TaskEvent `json:"events"`
			}{events})
		}
		if len(events) == 0 {
			fmt.Fprintf(c.stderr, "task %s has published no event\n", id)
			return nil
		}
		tw := newTable(c.stdout)
		fmt.Fprintln(tw, "KEY\tSET\tVALUE")
		for _, e := range events {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", e.Key, formatTime(&e.At), e.Value)
		}
		return tw.Flush()
	}
	return cmd
}
