package cli

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/spf13/cobra"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/behaviors/replication"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/store/postgres"
)

// newReplicationsCmd returns `stint replications` and its subcommands.
func (c *cli) newReplicationsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "replications",
		Short: "Inspect, define and undefine table replications",
		Long: `Inspect replications: the tasks of the replication and replication.continuous
behaviors, and the persistent definitions whose task has ended and been
deleted. States: pending, running, crashing (failed, retried after a backoff
penalty), completed (a one-shot replication that caught up), failed.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return cmd.Help()
		},
	}
	cmd.AddCommand(c.newReplicationsLsCmd(), c.newReplicationsShowCmd(),
		c.newReplicationsDefineCmd(), c.newReplicationsUndefineCmd(), c.newReplicationsTriggerCmd())
	return cmd
}

// openReplications opens the store and a client on the database db names.
// close releases both.
func (c *cli) openReplications(ctx context.Context, db *dbFlag) (*postgres.Store, *impl.Client, func(), error) {
	st, err := c.openStore(ctx, db, postgres.MaxConns(4), postgres.PollOnly())
	if err != nil {
		return nil, nil, nil, err
	}
	client, err := impl.NewClient(st, impl.ClientConfig{Registry: c.reg, Logger: c.log})
	if err != nil {
		st.Close()
		return nil, nil, nil, fmt.Errorf("create client: %w", err)
	}
	return st, client, func() { client.Close(); st.Close() }, nil
}

// newReplicationsLsCmd returns `stint replications ls`.
func (c *cli) newReplicationsLsCmd() *cobra.Command {
	var asJSON bool
	var state string
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List replications with their state, last sequence, lag and error count",
		Long: `List every replication: its task id (and definition name, if persistent), mode,
state, the last sequence (change value) replicated, the lag (how many change
values the source was ahead at the last checkpoint), the consecutive error
count (reset after a healthy run), the node and the tables.`,
		Example: `  stint replications ls
  stint replications ls --state crashing --json`,
		Args: exactArgs(0),
	}
	db := addDBFlag(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the replications as JSON")
	cmd.Flags().StringVar(&state, "state", "", "only replications in this state: pending, running, crashing, completed or failed")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		ctx := cmd.Context()
		switch replication.State(state) {
		case "", replication.StatePending, replication.StateRunning, replication.StateCrashing, replication.StateCompleted, replication.StateFailed:
		default:
			return usageErrorf("--state %q: want pending, running, crashing, completed or failed", state)
		}
		st, client, closeAll, err := c.openReplications(ctx, db)
		if err != nil {
			return err
		}
		defer closeAll()
		list, err := replication.List(ctx, client, st.Pool())
		if definitionsUnreadable(err) {
			// No definitions table, or a role that may not read it
			// (stint_client): tasks only.
			fmt.Fprintf(c.stderr, "%s: persistent definitions not shown: %v\n", c.name, err)
			list, err = replication.List(ctx, client, nil)
		}
		if err != nil {
			return c.schemaHint(err)
		}
		var out []replication.Info
		for _, info := range list {
			if state == "" || info.State == replication.State(state) {
				info.Progress = nil // ls shows the summary
				out = append(out, info)
			}
		}
		if asJSON {
			if out == nil {
				out = []replication.Info{}
			}
			return writeJSON(c.stdout, struct {
				Replications []replication.Info `json:"replications"`
			}{out})
		}
		if len(out) == 0 {
			fmt.Fprintln(c.stderr, "no replications")
			return nil
		}
		tw := newTable(c.stdout)
		fmt.Fprintln(tw, "ID\tDEFINITION\tMODE\tSTATE\tSEQ\tLAG\tERRORS\tNODE\tSOURCE\tTARGET\tUPDATED")
		for _, r := range out {
			lag := "unknown"
			if r.LagKnown {
				lag = strconv.FormatInt(r.Lag, 10)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%d\t%s\t%s\t%s\t%s\n",
				orDash(string(r.TaskID)), orDash(r.Definition), mode(r.Continuous), r.State, r.Seq, lag, r.Errors,
				orDash(r.Node), r.Source.Table, r.Target.Table, formatTime(&r.UpdatedAt))
		}
		if err := tw.Flush(); err != nil {
			return fmt.Errorf("write table: %w", err)
		}
		return nil
	}
	return cmd
}

// newReplicationsShowCmd returns `stint replications show`.
func (c *cli) newReplicationsShowCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "show ID|NAME",
		Short: "Show a replication, by task id or definition name",
		Args:  exactArgs(1, "ID|NAME"),
	}
	db := addDBFlag(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the replication as JSON")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		ctx := cmd.Context()
		st, client, closeAll, err := c.openReplications(ctx, db)
		if err != nil {
			return err
		}
		defer closeAll()
		pool := st.Pool()
		info, def, err := replication.Lookup(ctx, client, pool, args[0])
		if definitionsUnreadable(err) {
			fmt.Fprintf(c.stderr, "%s: persistent definitions not shown: %v\n", c.name, err)
			info, def, err = replication.Lookup(ctx, client, nil, args[0])
		}
		if errors.Is(err, api.ErrNotFound) {
			return fmt.Errorf("replication %q not found (neither a task id nor a definition name)", args[0])
		}
		if err != nil {
			return c.schemaHint(err)
		}
		if asJSON {
			return writeJSON(c.stdout, struct {
				replication.Info
				Definition *replication.StoredDefinition `json:"definition,omitempty"`
			}{info, def})
		}
		tw := newTable(c.stdout)
		row := func(name, value string) { fmt.Fprintf(tw, "%s:\t%s\n", name, value) }
		row("task", orDash(string(info.TaskID)))
		row("definition", orDash(info.Definition))
		row("mode", mode(info.Continuous))
		row("state", string(info.State))
		row("owner", orDash(info.Owner))
		row("source", info.Source.Table+" in "+info.Source.DSN)
		row("target", info.Target.Table+" in "+info.Target.DSN)
		row("last sequence", strconv.FormatInt(info.Seq, 10))
		row("lag", info.LagText(time.Now()))
		row("errors", strconv.Itoa(info.Errors))
		row("last error", orDash(info.LastError))
		row("node", orDash(info.Node))
		row("next run", formatTime(info.NextRun))
		row("checkpointed", formatTime(info.CheckpointedAt))
		row("updated", formatTime(&info.UpdatedAt))
		if p := info.Progress; p != nil {
			row("replication id", p.ReplicationID)
			row("layout", orDash(p.Layout))
			row("rows", fmt.Sprintf("%d read, %d written, %d deleted", p.RowsRead, p.RowsWritten, p.RowsDeleted))
			row("checkpoints", strconv.FormatInt(p.Checkpoints, 10))
			row("healthy since", formatTime(p.HealthySince))
		}
		if r := info.Result; r != nil {
			row("result", fmt.Sprintf("sequence %d; %d read, %d written, %d deleted", r.Seq, r.RowsRead, r.RowsWritten, r.RowsDeleted))
		}
		if def != nil {
			row("definition version", strconv.FormatInt(def.Version, 10))
			row("defined", formatTime(&def.CreatedAt))
		}
		if err := tw.Flush(); err != nil {
			return fmt.Errorf("write replication: %w", err)
		}
		return nil
	}
	return cmd
}

// mode names a replication's mode.
func mode(continuous bool) string {
	if continuous {
		return "continuous"
	}
	return "one-shot"
}

// definitionsUnreadable reports whether err says that the replication
// definitions cannot be read: no such table (an old schema) or no
// privilege on it.
func definitionsUnreadable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "42501")
}
