package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/spi"
)

// newTaskStepCmds returns `stint tasks rewind|fork`: the operations that
// start from a step of a task (api.Task.Steps).
func (c *cli) newTaskStepCmds() []*cobra.Command {
	var step int
	var newID string
	rewind := &cobra.Command{
		Use:   "rewind ID --step N",
		Short: "Run a finished task again from one of its steps",
		Long: `Run a task that finished for good (succeeded or failed) again from one of the
steps its behavior kept (spi.Policy.KeepSteps; stint tasks show lists them): it
is due at once with that step's progress and a fresh count of attempts, and the
steps after it are deleted. A task that runs or waits to run is refused, as are
a workflow's nodes (retry the node) and a workflow's own task.`,
		Example: `  stint tasks rewind counted --step 2`,
		Args:    exactArgs(1, "ID"),
	}
	fork := &cobra.Command{
		Use:   "fork ID --step N --id NEW",
		Short: "Submit a copy of a task that starts from one of its steps",
		Long: `Submit a new task, NEW, that copies the task ID from one of its steps: the same
behavior, params, priority, group key and retention, that step's progress and
the steps up to it. It is due at once; the task ID is left as it is. A NEW that
exists is refused, as are a running task, a workflow's nodes and a workflow's
own task.`,
		Example: `  stint submit demo.echo --params '{"text":"hi","steps":3}' --id counted --wait
  stint tasks show counted
  stint tasks fork counted --step 2 --id counted-again`,
		Args: exactArgs(1, "ID"),
	}
	for _, cmd := range []*cobra.Command{rewind, fork} {
		cmd.Flags().IntVar(&step, "step", 0, "the step to start from, from 1 (required)")
	}
	fork.Flags().StringVar(&newID, "id", "", "the new task's id (required)")
	rewindDB, forkDB := addDBFlag(rewind), addDBFlag(fork)
	rewind.RunE = func(cmd *cobra.Command, args []string) error {
		return c.runStepCmd(cmd.Context(), rewindDB, api.TaskID(args[0]), step, func(ctx context.Context, client *impl.Client, id api.TaskID) error {
			if err := client.Rewind(ctx, id, step); err != nil {
				return err
			}
			fmt.Fprintf(c.stdout, "task %s runs again from step %d\n", id, step)
			return nil
		})
	}
	fork.RunE = func(cmd *cobra.Command, args []string) error {
		if newID == "" {
			return usageErrorf("--id is required: name the new task")
		}
		if err := spi.CheckTaskID("--id", api.TaskID(newID)); err != nil {
			return err
		}
		return c.runStepCmd(cmd.Context(), forkDB, api.TaskID(args[0]), step, func(ctx context.Context, client *impl.Client, id api.TaskID) error {
			sub, err := client.Fork(ctx, id, step, api.TaskID(newID))
			if err != nil {
				return err
			}
			fmt.Fprintf(c.stdout, "task %s submitted: a copy of task %s from step %d\n", sub.ID, id, step)
			return nil
		})
	}
	return []*cobra.Command{rewind, fork}
}

// runStepCmd checks the task id and the step of a rewind or a fork, and
// runs do on a client of db.
func (c *cli) runStepCmd(ctx context.Context, db *dbFlag, id api.TaskID, step int, do func(context.Context, *impl.Client, api.TaskID) error) error {
	if err := spi.CheckTaskID("id", id); err != nil {
		return err
	}
	if step < 1 {
		return usageErrorf("--step is required: a step of the task, from 1 (stint tasks show %s lists them)", id)
	}
	client, closeClient, err := c.openClient(ctx, db)
	if err != nil {
		return err
	}
	defer closeClient()
	err = do(ctx, client, id)
	switch {
	case err == nil:
		return nil
	case err == api.ErrNotFound:
		return fmt.Errorf("task %s not found", id)
	case errors.Is(err, api.ErrNotFound):
		// An unknown step: the store's message says which.
		return errors.New(strings.TrimSuffix(err.Error(), ": "+api.ErrNotFound.Error()))
	}
	return c.schemaHint(err)
}

// printSteps prints the steps of a task, one a line: its number, when it
// was stored (to the millisecond: a run's steps often share a second) and
// its progress on one line.
func (c *cli) printSteps(steps []api.Step) error {
	rows := make([][]string, len(steps))
	for i, s := range steps {
		rows[i] = []string{strconv.Itoa(s.N), s.At.Local().Format(timeFormat + ".000"), compactJSON(s.Progress)}
	}
	return c.printSection("steps", rows)
}

// printSection prints title and under it rows, indented, as a table;
// nothing when there are no rows.
func (c *cli) printSection(title string, rows [][]string) error {
	if len(rows) == 0 {
		return nil
	}
	fmt.Fprintln(c.stdout, title+":")
	tw := newTable(c.stdout)
	for _, r := range rows {
		fmt.Fprintf(tw, "  %s\n", strings.Join(r, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write %s: %w", title, err)
	}
	return nil
}

// compactJSON writes raw on one line; raw as it is when it is no JSON.
func compactJSON(raw []byte) string {
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return string(raw)
	}
	return b.String()
}
