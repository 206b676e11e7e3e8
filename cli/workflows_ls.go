package cli

import (
	"fmt"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/stinthq/stint/api"
)

// newWorkflowsLsCmd returns `stint workflows ls`.
func (c *cli) newWorkflowsLsCmd() *cobra.Command {
	var (
		state, after string
		limit        int
		asJSON       bool
	)
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List workflows, a page at a time, in id order",
		Long: `List the workflows in id order, a page at a time, each with its state and how
many of its nodes have not ended. A workflow's state here is the one its own
task recorded: one whose last node just ended stays running until that task
ran (show counts its nodes and says at once). When more workflows match, the
last line names the cursor to pass as --after for the next page (with --json,
the "next" field).`,
		Example: `  stint workflows ls --state failed
  stint workflows ls --limit 500 --after nightly-2026-11-27`,
		Args: exactArgs(0),
	}
	db := addDBFlag(cmd)
	addReadDBFlag(cmd, db)
	f := cmd.Flags()
	f.StringVar(&state, "state", "", "only workflows in this state: running, succeeded, failed or cancelled")
	f.StringVar(&after, "after", "", "cursor: only workflows after this id (the previous page's next)")
	f.IntVar(&limit, "limit", defaultListLimit, "page size, 1 to "+strconv.Itoa(maxListLimit))
	f.BoolVar(&asJSON, "json", false, "print the page as JSON")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		ctx := cmd.Context()
		if limit < 1 || limit > maxListLimit {
			return usageErrorf("--limit %d is outside 1..%d", limit, maxListLimit)
		}
		if s := api.WorkflowState(state); s != "" && !s.Valid() {
			return usageErrorf("--state %q is not a workflow state: want running, succeeded, failed or cancelled", state)
		}
		client, closeClient, err := c.openClient(ctx, db)
		if err != nil {
			return err
		}
		defer closeClient()
		page, err := client.ListWorkflows(ctx, api.WorkflowFilter{State: api.WorkflowState(state), After: api.TaskID(after), Limit: limit})
		if err != nil {
			return fmt.Errorf("list workflows: %w", c.schemaHint(err))
		}
		if asJSON {
			return writeJSON(c.stdout, page)
		}
		if len(page.Workflows) == 0 {
			fmt.Fprintln(c.stderr, "no workflows match")
			return nil
		}
		tw := newTable(c.stdout)
		fmt.Fprintln(tw, "ID\tSTATE\tPENDING\tCREATED\tFINISHED")
		for _, w := range page.Workflows {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", w.ID, w.State, w.Pending, formatTime(&w.CreatedAt), formatTime(w.FinishedAt))
		}
		if err := tw.Flush(); err != nil {
			return fmt.Errorf("write table: %w", err)
		}
		if page.Next != "" {
			fmt.Fprintf(c.stdout, "next: %s (more workflows match: pass --after %s)\n", page.Next, page.Next)
		}
		return nil
	}
	return cmd
}
