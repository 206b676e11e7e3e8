package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/store/postgres"
)

// newStatsCmd returns `stint stats`: task counts per behavior and status,
// the backlog due now with its lag, and running tasks per node.
func (c *cli) newStatsCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "stats",
		Short: "Show task counts per behavior and status, the backlog and running tasks per node",
		Args:  exactArgs(0),
	}
	db := addDBFlag(cmd)
	addReadDBFlag(cmd, db)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the statistics as JSON")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		ctx := cmd.Context()
		st, err := c.openStore(ctx, db, postgres.MaxConns(2))
		if err != nil {
			return err
		}
		defer st.Close()
		stats, err := st.Stats(ctx)
		if err != nil {
			return fmt.Errorf("read statistics: %w", c.schemaHint(err))
		}
		if asJSON {
			return writeJSON(c.stdout, stats)
		}
		if len(stats.Counts) == 0 && len(stats.Due) == 0 && len(stats.Running) == 0 {
			fmt.Fprintln(c.stderr, "no tasks")
			return nil
		}
		// Each table is printed only when it has rows: no empty headers.
		tw := newTable(c.stdout)
		first := true
		section := func(header string, rows int, row func(i int)) {
			if rows == 0 {
				return
			}
			if !first {
				fmt.Fprintln(tw)
			}
			first = false
			fmt.Fprintln(tw, header)
			for i := range rows {
				row(i)
			}
		}
		section("BEHAVIOR\tSTATUS\tTASKS", len(stats.Counts), func(i int) {
			n := stats.Counts[i]
			fmt.Fprintf(tw, "%s\t%s\t%d\n", n.Behavior, n.Status, n.Count)
		})
		section("BEHAVIOR\tDUE NOW\tOLDEST DUE", len(stats.Due), func(i int) {
			d := stats.Due[i]
			fmt.Fprintf(tw, "%s\t%d\t%s\n", d.Behavior, d.Count, formatAge(d.OldestAge))
		})
		section("NODE\tRUNNING\tLEASE EXPIRED", len(stats.Running), func(i int) {
			n := stats.Running[i]
			fmt.Fprintf(tw, "%s\t%d\t%d\n", orDash(n.Node), n.Running, n.Expired)
		})
		if err := tw.Flush(); err != nil {
			return fmt.Errorf("write table: %w", err)
		}
		return nil
	}
	return cmd
}

// newTasksWaitCmd returns `stint tasks wait`: await a task submitted
// elsewhere, showing its progress.
func (c *cli) newTasksWaitCmd() *cobra.Command {
	var (
		asJSON  bool
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "wait ID",
		Short: "Wait for a task to finish, showing its progress; exit 1 if it failed, 130 on Ctrl-C",
		Args:  exactArgs(1, "ID"),
	}
	db := addDBFlag(cmd)
	addReadDBFlag(cmd, db)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the finished task as JSON")
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "stop waiting after this long (0: no limit)")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		ctx := cmd.Context()
		id := api.TaskID(args[0])
		if err := spi.CheckTaskID("id", id); err != nil {
			return err
		}
		if timeout < 0 {
			return usageErrorf("--timeout %s is negative", timeout)
		}
		client, closeClient, err := c.openClient(ctx, db)
		if err != nil {
			return err
		}
		defer closeClient()
		waitCtx := ctx
		if timeout > 0 {
			var cancel func()
			waitCtx, cancel = context.WithTimeout(ctx, timeout)
			defer cancel()
		}
		t, err := c.awaitWithProgress(waitCtx, client, id)
		if err != nil {
			return c.waitEnded(ctx, awaited{what: "task", id: id, show: "tasks"}, timeout, err)
		}
		if asJSON {
			c.reg.RedactTask(&t)
			if err := writeJSON(c.stdout, t); err != nil {
				return err
			}
		} else {
			printOutcome(c.stdout, t)
		}
		if t.Status == api.StatusFailure {
			return silentExit(exitFailure)
		}
		return nil
	}
	return cmd
}
