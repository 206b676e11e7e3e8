package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/web"
)

// newWorkflowsCmd returns `stint workflows` and its subcommands.
func (c *cli) newWorkflowsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "workflows",
		Short: "Submit, inspect, cancel, retry, hold and remove workflows (graphs of tasks)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return cmd.Help()
		},
	}
	cmd.AddCommand(c.newWorkflowsSubmitCmd(), c.newWorkflowsLsCmd(), c.newWorkflowsShowCmd(),
		c.newWorkflowActionCmd("cancel", "Cancel a workflow: its nodes that have not ended end cancelled, running ones halt (refused once they all ended)", "cancelled",
			func(client api.Workflows) func(context.Context, api.TaskID) error { return client.CancelWorkflow }),
		c.newWorkflowActionCmd("retry", "Run an ended workflow's failed, skipped and cancelled nodes again", "retried",
			func(client api.Workflows) func(context.Context, api.TaskID) error { return client.RetryWorkflow }),
		c.newWorkflowActionCmd("hold", "Hold a workflow: its due nodes, and those that become ready, wait until release", "held",
			func(client api.Workflows) func(context.Context, api.TaskID) error { return client.HoldWorkflow }),
		c.newWorkflowActionCmd("release", "Release a held workflow and its held nodes", "released",
			func(client api.Workflows) func(context.Context, api.TaskID) error { return client.ReleaseWorkflow }),
		c.newWorkflowActionCmd("rm", "Remove a workflow with all its nodes (running ones halt)", "removed",
			func(client api.Workflows) func(context.Context, api.TaskID) error { return client.RemoveWorkflow }))
	return cmd
}

// newWorkflowsSubmitCmd returns `stint workflows submit`.
func (c *cli) newWorkflowsSubmitCmd() *cobra.Command {
	var wait bool
	cmd := &cobra.Command{
		Use:   "submit FILE",
		Short: "Submit a workflow described as JSON (FILE, or - for standard input)",
		Long: `Submit a workflow: a graph of tasks stored whole or not at all. FILE holds the
body of POST /api/v1/workflows:

  {"id": "nightly-2026-11-27",
   "nodes": [
     {"name": "fetch", "task": {"behavior": "demo.echo", "params": {"text": "fetch"}}},
     {"name": "merge", "task": {"behavior": "demo.echo", "params": {"text": "merge"}}, "depends_on": ["fetch"]},
     {"name": "notify", "task": {"behavior": "demo.echo", "params": {"text": "notify"}}, "finally": true}]}

A node's rule ("rule") is all_succeeded (the default), all_ended, any_succeeded
or none_failed. A node with "gate": {"topic": "approval", "timeout": "72h"}
and no behavior waits for a signal of the topic ('stint signal --workflow ID
--node NAME TOPIC PAYLOAD') and succeeds with its payload. A bad workflow (a cycle, an unknown dependency, invalid params
of a node) is refused with exit code 2, naming the problem, and nothing is
stored.`,
		Example: `  stint workflows submit nightly.json --wait
  cat nightly.json | stint workflows submit -`,
		Args: exactArgs(1, "FILE"),
	}
	db := addDBFlag(cmd)
	cmd.Flags().BoolVar(&wait, "wait", false, "wait for the workflow to end, then show it; exit 1 unless it succeeded, 130 on Ctrl-C (it runs on)")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		ctx := cmd.Context()
		req, err := readWorkflow(args[0], cmd.InOrStdin())
		if err != nil {
			return err
		}
		client, closeClient, err := c.openClient(ctx, db)
		if err != nil {
			return err
		}
		defer closeClient()
		sub, err := client.SubmitWorkflow(ctx, req)
		if err != nil {
			return c.schemaHint(err)
		}
		if !sub.Created {
			fmt.Fprintf(c.stderr, "workflow %s exists: nothing was stored\n", sub.ID)
		}
		fmt.Fprintln(c.stdout, sub.ID)
		if !wait {
			return nil
		}
		w, err := client.AwaitWorkflow(ctx, sub.ID)
		if err != nil {
			return c.waitEnded(ctx, awaited{what: "workflow", id: sub.ID, show: "workflows", submitted: true}, 0, err)
		}
		if err := c.printWorkflow(w); err != nil {
			return err
		}
		if w.State != api.WorkflowSucceeded {
			return fmt.Errorf("workflow %s %s", w.ID, w.State)
		}
		return nil
	}
	return cmd
}

// readWorkflow reads the JSON workflow of file (- for r).
func readWorkflow(file string, r io.Reader) (api.WorkflowRequest, error) {
	var raw []byte
	var err error
	if file == "-" {
		raw, err = io.ReadAll(r)
	} else {
		raw, err = os.ReadFile(file)
	}
	if err != nil {
		return api.WorkflowRequest{}, usageErrorf("cannot read the workflow: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var body web.WorkflowBody
	if err := dec.Decode(&body); err != nil {
		return api.WorkflowRequest{}, usageErrorf("%s: not a workflow: %v", file, err)
	}
	req, err := body.Request()
	if err != nil {
		return api.WorkflowRequest{}, usageErrorf("%s: %v", file, err)
	}
	return req, nil
}

// newWorkflowActionCmd returns `stint workflows VERB ID`, which calls
// act's method and says done.
func (c *cli) newWorkflowActionCmd(verb, short, done string, act func(api.Workflows) func(context.Context, api.TaskID) error) *cobra.Command {
	cmd := &cobra.Command{
		Use:   verb + " ID",
		Short: short,
		Args:  exactArgs(1, "ID"),
	}
	db := addDBFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		ctx := cmd.Context()
		return c.onWorkflow(ctx, db, args[0], func(client api.Workflows, id api.TaskID) error {
			if err := act(client)(ctx, id); err != nil {
				return err
			}
			fmt.Fprintf(c.stdout, "workflow %s %s\n", id, done)
			return nil
		})
	}
	return cmd
}

// onWorkflow checks the workflow id arg, opens a client on db and calls fn
// with both: a workflow fn does not find is said to be missing, its other
// errors get the schema's hint.
func (c *cli) onWorkflow(ctx context.Context, db *dbFlag, arg string, fn func(api.Workflows, api.TaskID) error) error {
	id := api.TaskID(arg)
	if err := spi.CheckTaskID("id", id); err != nil {
		return err
	}
	client, closeClient, err := c.openClient(ctx, db)
	if err != nil {
		return err
	}
	defer closeClient()
	if err := fn(client, id); errors.Is(err, api.ErrNotFound) {
		return fmt.Errorf("workflow %s not found", id)
	} else if err != nil {
		return c.schemaHint(err)
	}
	return nil
}
